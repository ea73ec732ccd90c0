"""What Triton's `examples/custom_metrics` model does: OUTPUT0 = INPUT0 + INPUT1 and OUTPUT1 =
INPUT0 - INPUT1, and the time spent in execute added to the counter `requests_process_latency_ns`
(labels model and version) created in initialize. Besides: each process counts itself in
`custom_metrics_processes` when it starts, and every request in `custom_metrics_requests`; the
sum of INPUT0 goes to the histogram `custom_metrics_input_sum`."""

import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.output0_dtype = pb_utils.triton_string_to_numpy(
            pb_utils.get_output_config_by_name(config, "OUTPUT0")["data_type"])
        self.output1_dtype = pb_utils.triton_string_to_numpy(
            pb_utils.get_output_config_by_name(config, "OUTPUT1")["data_type"])
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self.latency_family = pb_utils.MetricFamily(
            name="requests_process_latency_ns", description="Cumulative time spent processing requests",
            kind=pb_utils.MetricFamily.COUNTER)
        self.latency = self.latency_family.Metric(labels=labels)
        self.processes_family = pb_utils.MetricFamily(
            "custom_metrics_processes", "Model processes started", pb_utils.MetricFamily.COUNTER)
        self.processes = self.processes_family.Metric(labels=labels)
        self.processes.increment(1)
        self.requests_family = pb_utils.MetricFamily(
            "custom_metrics_requests", "Requests executed", pb_utils.MetricFamily.COUNTER)
        self.requests = self.requests_family.Metric(labels=labels)
        self.input_family = pb_utils.MetricFamily(
            "custom_metrics_input_sum", "Sum of INPUT0 per request", pb_utils.MetricFamily.HISTOGRAM)
        self.input_sum = self.input_family.Metric(labels=labels, buckets=[0.0, 10.0, 100.0])

    def execute(self, requests):
        start_ns = time.time_ns()
        responses = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", (in0 + in1).astype(self.output0_dtype)),
                pb_utils.Tensor("OUTPUT1", (in0 - in1).astype(self.output1_dtype))]))
            self.requests.increment(1)
            self.input_sum.observe(float(in0.sum()))
        self.latency.increment(max(time.time_ns() - start_ns, 1))
        return responses
