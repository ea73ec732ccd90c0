/*
 * Identity as a naiad custom backend: for every input INPUT<n>, output OUTPUT<n> with the same
 * datatype, shape and bytes (any numeric datatype). The conformance suite's identity_<type> models.
 */
#include <string.h>

#include "naiad_backend.h"

uint32_t naiad_backend_abi_version(void) { return NAIAD_BACKEND_ABI_VERSION; }

int32_t naiad_backend_create(const char *config_json, const char *version_dir, uint32_t instance_index,
                             void **state, char **error) {
  (void)config_json;
  (void)version_dir;
  (void)instance_index;
  (void)error;
  *state = NULL; /* nothing to keep */
  return 0;
}

int32_t naiad_backend_execute(void *state, const naiad_request *requests, uint32_t request_count,
                              naiad_allocate_fn allocate, void *context, char **request_errors, char **error) {
  (void)state;
  (void)error;
  for (uint32_t r = 0; r < request_count; r++) {
    for (uint32_t i = 0; i < requests[r].input_count; i++) {
      const naiad_tensor *input = &requests[r].inputs[i];
      if (strncmp(input->name, "INPUT", 5) != 0) {
        request_errors[r] = naiad_backend_message("unexpected input '%s': inputs are named INPUT<n>", input->name);
        break;
      }
      char name[256];
      snprintf(name, sizeof name, "OUTPUT%s", input->name + 5);
      void *output = allocate(context, r, name, input->datatype, input->dims_count, input->shape);
      if (output == NULL) break; /* refused: the request fails with the allocator's reason */
      if (input->byte_size) memcpy(output, input->data, input->byte_size);
    }
  }
  return 0;
}

void naiad_backend_destroy(void *state) { (void)state; }

void naiad_backend_free(void *pointer) { free(pointer); }
