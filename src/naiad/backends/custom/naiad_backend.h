/*
 * naiad_backend.h: the C ABI of naiad's "custom" backend, version 1 (docs/custom_backend.md).
 *
 * A custom backend is a shared library in the model's version directory (model.so unless the
 * config's default_model_filename names another file) exporting the five functions below. naiad
 * loads it in a process of its own per model instance: a crash in the library fails that
 * instance's requests in flight, and a new process (create() again) serves the next ones.
 *
 * Plain C; every call for one state comes from one thread at a time.
 */
#ifndef NAIAD_BACKEND_H
#define NAIAD_BACKEND_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NAIAD_BACKEND_ABI_VERSION 1u

/* Element types: the values of Triton's TRITONSERVER_DataType. Version 1 passes the numeric
 * types only (no BYTES, no BF16); tensors are row-major, contiguous, little-endian; BOOL is one
 * byte per element (0 or 1). */
typedef enum naiad_datatype {
  NAIAD_TYPE_INVALID = 0,
  NAIAD_TYPE_BOOL = 1,
  NAIAD_TYPE_UINT8 = 2,
  NAIAD_TYPE_UINT16 = 3,
  NAIAD_TYPE_UINT32 = 4,
  NAIAD_TYPE_UINT64 = 5,
  NAIAD_TYPE_INT8 = 6,
  NAIAD_TYPE_INT16 = 7,
  NAIAD_TYPE_INT32 = 8,
  NAIAD_TYPE_INT64 = 9,
  NAIAD_TYPE_FP16 = 10,
  NAIAD_TYPE_FP32 = 11,
  NAIAD_TYPE_FP64 = 12
} naiad_datatype;

/* One input tensor of a request. Everything it points to is owned by naiad and valid until
 * naiad_backend_execute returns. For a model with max_batch_size > 0 the shape starts with the
 * request's batch dimension. */
typedef struct naiad_tensor {
  const char *name;
  int32_t datatype; /* a naiad_datatype */
  uint32_t dims_count;
  const int64_t *shape;
  const void *data;
  uint64_t byte_size;
} naiad_tensor;

/* One request of a batch. */
typedef struct naiad_request {
  const char *id;         /* the client's request id, "" when it gave none */
  const char *parameters; /* the request's parameters as a JSON object, "{}" when none */
  uint32_t input_count;
  const naiad_tensor *inputs;
  uint32_t output_count;            /* the outputs the client asked for (all of the config's */
  const char *const *output_names;  /* outputs when it named none): each must be produced */
} naiad_request;

/* The host's output allocator, handed to naiad_backend_execute. Call it once per output of a
 * request, when the output's shape is known: it returns a buffer of exactly
 * product(shape) * element size bytes for the library to fill, owned by naiad and valid until
 * execute returns. It returns NULL when it refuses (an output the config does not declare, a
 * datatype or shape the config does not allow, the same output twice): that request then fails
 * with the allocator's reason, so the library just skips writing it. */
typedef void *(*naiad_allocate_fn)(void *context, uint32_t request, const char *name, int32_t datatype,
                                   uint32_t dims_count, const int64_t *shape);

/* Functions the library exports. Strings the library hands back (errors) are allocated by the
 * library and released by naiad through naiad_backend_free. */

/* Must return NAIAD_BACKEND_ABI_VERSION as compiled into the library; naiad refuses others. */
uint32_t naiad_backend_abi_version(void);

/* Create one instance. config_json: the model's complete configuration (Triton's ModelConfig
 * as JSON, as /v2/models/<m>/config shows it); version_dir: the directory holding the library
 * (read model files from there); instance_index: 0, 1, ... over the model's instances.
 * Returns 0 and sets *state, or returns nonzero and sets *error (the model's load fails with
 * that message). */
int32_t naiad_backend_create(const char *config_json, const char *version_dir, uint32_t instance_index,
                             void **state, char **error);

/* Run a batch of request_count requests. Answer request i with its outputs (through allocate)
 * or with an error: set request_errors[i] (all NULL on entry) to fail request i alone.
 * Returns 0, or nonzero with *error set to fail every request of the batch (the instance
 * serves on). */
int32_t naiad_backend_execute(void *state, const naiad_request *requests, uint32_t request_count,
                              naiad_allocate_fn allocate, void *context, char **request_errors, char **error);

/* Release what create made (the model is unloading). */
void naiad_backend_destroy(void *state);

/* Release a string the library returned (an error). */
void naiad_backend_free(void *pointer);

/* A helper for libraries: a printf-formatted message in memory from malloc, for a library
 * whose naiad_backend_free calls free(). */
static inline char *naiad_backend_message(const char *format, ...) {
  va_list args;
  va_start(args, format);
  int length = vsnprintf(NULL, 0, format, args);
  va_end(args);
  char *text = (char *)malloc(length < 0 ? 1 : (size_t)length + 1);
  if (text == NULL) return NULL;
  va_start(args, format);
  vsnprintf(text, length < 0 ? 1 : (size_t)length + 1, format, args);
  va_end(args);
  return text;
}

#ifdef __cplusplus
}
#endif

#endif /* NAIAD_BACKEND_H */
