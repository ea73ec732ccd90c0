/*
 * A naiad custom backend that fails on demand, for the tests of crash containment and error paths.
 * Otherwise OUTPUT0 = INPUT0 (any numeric datatype).
 *   config parameter "fail_create"       create() fails with "create refused on purpose"
 *   request parameter "crash"            execute() dereferences a null pointer (SIGSEGV)
 *   request parameter "fail"             that request alone fails with "request failed on purpose"
 *   request parameter "fail_batch"       the whole batch fails with "batch failed on purpose"
 * Parameters are found by their quoted key in the JSON text: enough for a test library.
 */
#include <string.h>

#include "naiad_backend.h"

static int has_key(const char *json, const char *key) {
  char quoted[64];
  snprintf(quoted, sizeof quoted, "\"%s\"", key);
  return json != NULL && strstr(json, quoted) != NULL;
}

uint32_t naiad_backend_abi_version(void) { return NAIAD_BACKEND_ABI_VERSION; }

int32_t naiad_backend_create(const char *config_json, const char *version_dir, uint32_t instance_index,
                             void **state, char **error) {
  (void)version_dir;
  (void)instance_index;
  if (has_key(config_json, "fail_create")) {
    *error = naiad_backend_message("create refused on purpose");
    return 1;
  }
  *state = NULL;
  return 0;
}

int32_t naiad_backend_execute(void *state, const naiad_request *requests, uint32_t request_count,
                              naiad_allocate_fn allocate, void *context, char **request_errors, char **error) {
  (void)state;
  for (uint32_t r = 0; r < request_count; r++) {
    if (has_key(requests[r].parameters, "fail_batch")) {
      *error = naiad_backend_message("batch failed on purpose");
      return 1;
    }
  }
  for (uint32_t r = 0; r < request_count; r++) {
    const naiad_request *request = &requests[r];
    if (has_key(request->parameters, "crash")) {
      volatile int *volatile nowhere = NULL; /* volatile twice: the compiler keeps the bad write */
      *nowhere = 42;
    }
    if (has_key(request->parameters, "fail")) {
      request_errors[r] = naiad_backend_message("request failed on purpose");
      continue;
    }
    const naiad_tensor *input = &request->inputs[0];
    void *output = allocate(context, r, "OUTPUT0", input->datatype, input->dims_count, input->shape);
    if (output != NULL && input->byte_size) memcpy(output, input->data, input->byte_size);
  }
  return 0;
}

void naiad_backend_destroy(void *state) { (void)state; }

void naiad_backend_free(void *pointer) { free(pointer); }
