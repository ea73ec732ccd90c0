/*
 * The conformance suite's MLP as a naiad custom backend: FP32 [batch, in] -> relu(x W1 + b1) W2 + b2
 * -> FP32 [batch, out]. create() reads the weights from weights.bin in the version directory:
 * three little-endian int32 sizes (in, hidden, out), then float32 W1 [in, hidden], b1 [hidden],
 * W2 [hidden, out], b2 [out], row-major, one after the other.
 * The output is named OUTPUT0; the input may have any name (the model has one).
 */
#include <string.h>

#include "naiad_backend.h"

typedef struct mlp {
  int32_t in, hidden, out;
  float *w1, *b1, *w2, *b2; /* views into values */
  float values[];
} mlp;

uint32_t naiad_backend_abi_version(void) { return NAIAD_BACKEND_ABI_VERSION; }

int32_t naiad_backend_create(const char *config_json, const char *version_dir, uint32_t instance_index,
                             void **state, char **error) {
  (void)config_json;
  (void)instance_index;
  char path[4096];
  snprintf(path, sizeof path, "%s/weights.bin", version_dir);
  FILE *file = fopen(path, "rb");
  if (file == NULL) {
    *error = naiad_backend_message("unable to open '%s'", path);
    return 1;
  }
  int32_t sizes[3] = {0, 0, 0};
  size_t got = fread(sizes, sizeof(int32_t), 3, file);
  if (got != 3 || sizes[0] <= 0 || sizes[1] <= 0 || sizes[2] <= 0 || sizes[0] > 1 << 16 || sizes[1] > 1 << 16 ||
      sizes[2] > 1 << 16) {
    fclose(file);
    *error = naiad_backend_message("'%s' must start with three positive int32 sizes (in, hidden, out)", path);
    return 1;
  }
  size_t count = (size_t)sizes[0] * sizes[1] + sizes[1] + (size_t)sizes[1] * sizes[2] + sizes[2];
  mlp *model = malloc(sizeof *model + count * sizeof(float));
  size_t read = model == NULL ? 0 : fread(model->values, sizeof(float), count, file);
  int extra = fgetc(file) != EOF;
  fclose(file);
  if (model == NULL || read != count || extra) {
    free(model);
    *error = naiad_backend_message("'%s' must hold exactly %zu float32 values after its sizes", path, count);
    return 1;
  }
  model->in = sizes[0];
  model->hidden = sizes[1];
  model->out = sizes[2];
  model->w1 = model->values;
  model->b1 = model->w1 + (size_t)model->in * model->hidden;
  model->w2 = model->b1 + model->hidden;
  model->b2 = model->w2 + (size_t)model->hidden * model->out;
  *state = model;
  return 0;
}

/* y[r] = relu(x[r] W1 + b1) W2 + b2 for each of `rows` rows (pointers: the rows of every request
 * of the batch run together, so each weight row is read from memory once per batch, not once per
 * request). The sums run in double: 4096-term float sums drift from numpy's by more than the
 * tests' tolerance. */
static void forward(const mlp *m, int64_t rows, const float *const *x, float *const *y, double *hidden,
                    double *acc) {
  const int64_t in = m->in, hid = m->hidden, out = m->out;
  for (int64_t b = 0; b < rows; b++)
    for (int64_t j = 0; j < hid; j++) hidden[b * hid + j] = m->b1[j];
  for (int64_t i = 0; i < in; i++) {
    const float *w = m->w1 + i * hid;
    for (int64_t b = 0; b < rows; b++) {
      double v = x[b][i];
      double *h = hidden + b * hid;
      for (int64_t j = 0; j < hid; j++) h[j] += v * w[j];
    }
  }
  for (int64_t b = 0; b < rows; b++)
    for (int64_t k = 0; k < out; k++) acc[b * out + k] = m->b2[k];
  for (int64_t j = 0; j < hid; j++) {
    const float *w = m->w2 + j * out;
    for (int64_t b = 0; b < rows; b++) {
      double v = (float)hidden[b * hid + j]; /* the hidden layer is float32, as in numpy */
      if (v <= 0) continue;                  /* relu */
      double *o = acc + b * out;
      for (int64_t k = 0; k < out; k++) o[k] += v * w[k];
    }
  }
  for (int64_t b = 0; b < rows; b++)
    for (int64_t k = 0; k < out; k++) y[b][k] = (float)acc[b * out + k];
}

int32_t naiad_backend_execute(void *state, const naiad_request *requests, uint32_t request_count,
                              naiad_allocate_fn allocate, void *context, char **request_errors, char **error) {
  const mlp *model = state;
  int64_t total = 0;
  for (uint32_t r = 0; r < request_count; r++)
    if (requests[r].input_count == 1 && requests[r].inputs[0].dims_count == 2) total += requests[r].inputs[0].shape[0];
  size_t room = (size_t)(total > 0 ? total : 1);
  const float **xs = malloc(room * sizeof *xs);
  float **ys = malloc(room * sizeof *ys);
  double *scratch = malloc(room * (model->hidden + model->out) * sizeof(double));
  if (xs == NULL || ys == NULL || scratch == NULL) {
    free(xs), free(ys), free(scratch);
    *error = naiad_backend_message("out of memory");
    return 1;
  }
  int64_t rows = 0;
  for (uint32_t r = 0; r < request_count; r++) {
    const naiad_request *request = &requests[r];
    if (request->input_count != 1) {
      request_errors[r] = naiad_backend_message("expected 1 input, got %u", request->input_count);
      continue;
    }
    const naiad_tensor *x = &request->inputs[0];
    if (x->datatype != NAIAD_TYPE_FP32 || x->dims_count != 2 || x->shape[1] != model->in) {
      request_errors[r] = naiad_backend_message("input '%s' must be FP32 [batch, %d]", x->name, model->in);
      continue;
    }
    int64_t shape[2] = {x->shape[0], model->out};
    float *y = allocate(context, r, "OUTPUT0", NAIAD_TYPE_FP32, 2, shape);
    if (y == NULL) continue; /* refused: the request fails with the allocator's reason */
    for (int64_t b = 0; b < x->shape[0]; b++, rows++) {
      xs[rows] = (const float *)x->data + b * model->in;
      ys[rows] = y + b * model->out;
    }
  }
  forward(model, rows, xs, ys, scratch, scratch + room * model->hidden);
  free(xs), free(ys), free(scratch);
  return 0;
}

void naiad_backend_destroy(void *state) { free(state); }

void naiad_backend_free(void *pointer) { free(pointer); }
