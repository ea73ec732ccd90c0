"""Runs one custom-metric operation per request, so tests can drive pb_utils' metrics from outside.

COMMAND is a JSON object: {"op": "create", "key", "name", "description", "kind", "labels",
"buckets"} makes a family and a Metric kept under `key`; "increment" / "set" / "observe" with "key"
and "value"; "value" with "key"; "delete" with "key" drops the Metric (and its family); "crash"
kills this process; "ping" answers its process id. RESULT is {"ok": value} or {"error": message}
(the TritonModelException's message). Each process counts itself in `metric_ops_processes` when it
starts."""

import json
import os
import signal

import numpy as np
import triton_python_backend_utils as pb_utils

KINDS = {"counter": pb_utils.MetricFamily.COUNTER, "gauge": pb_utils.MetricFamily.GAUGE,
         "histogram": pb_utils.MetricFamily.HISTOGRAM}


class TritonPythonModel:
    def initialize(self, args):
        self.families = {}
        self.metrics = {}
        self.processes_family = pb_utils.MetricFamily(
            "metric_ops_processes", "Model processes started", pb_utils.MetricFamily.COUNTER)
        self.processes = self.processes_family.Metric()
        self.processes.increment(1)

    def execute(self, requests):
        responses = []
        for request in requests:
            command = json.loads(pb_utils.get_input_tensor_by_name(request, "COMMAND").as_numpy()[0])
            try:
                result = {"ok": self.run(command)}
            except pb_utils.TritonModelException as error:
                result = {"error": error.message()}
            out = np.array([json.dumps(result).encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("RESULT", out)]))
        return responses

    def run(self, command):
        op, key = command["op"], command.get("key")
        if op == "create":
            family = pb_utils.MetricFamily(command["name"], command.get("description", ""), KINDS[command["kind"]])
            self.families[key] = family
            self.metrics[key] = family.Metric(labels=command.get("labels"), buckets=command.get("buckets"))
            return None
        if op == "delete":
            del self.metrics[key]
            del self.families[key]
            return None
        if op == "crash":
            os.kill(os.getpid(), signal.SIGKILL)
        if op == "ping":
            return os.getpid()
        metric = self.metrics[key]
        if op == "value":
            return metric.value()
        getattr(metric, op)(command["value"])
        return None
