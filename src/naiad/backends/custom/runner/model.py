"""The model.py a custom backend's model process runs: the Python backend's stub loads it like a
user's model.py, and it hands each batch to the shared library through `library.py`.

Everything user code could crash (dlopen, create, execute) happens here, in the model process;
the server only sees the process die and fails what it held (see backend.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import triton_python_backend_utils as pb_utils

from naiad.backends.custom import library as lib


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        path = Path(args["custom_library"])
        outputs = {o["name"]: lib.OutputSpec(o["data_type"].removeprefix("TYPE_"), tuple(int(d) for d in o["dims"]))
                   for o in config.get("output", [])}
        self.output_names = list(outputs)
        try:
            self.instance = lib.load(path).create(args["model_config"], path.parent, int(args["custom_instance_index"]),
                                                  outputs, int(config.get("max_batch_size", 0)) > 0)
        except lib.LibraryError as error:
            raise pb_utils.TritonModelException(str(error)) from None

    def execute(self, requests: list[Any]) -> list[Any]:
        batch = [lib.Request({tensor.name(): tensor.as_numpy() for tensor in request.inputs()},
                             sorted(request.requested_output_names()) or self.output_names,
                             request.request_id(), request.parameters() or "{}")
                 for request in requests]
        # RuntimeError (the library failed the whole batch) fails every request, with its message.
        results = self.instance.execute(batch)
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError(result)) if isinstance(result, str)
                else pb_utils.InferenceResponse([pb_utils.Tensor(name, array) for name, array in result.items()])
                for result in results]

    def finalize(self) -> None:
        instance = getattr(self, "instance", None)
        if instance is not None:
            instance.close()
