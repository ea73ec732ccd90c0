"""PP-OCRv4 text detection, direction classification and recognition, chained with BLS calls.

The three networks are ordinary ONNX models of the same repository (ocr_det, ocr_cls, ocr_rec),
so they batch and report statistics on their own; this model only does the numpy work between
them (see ocr_image.py and ocr_boxes.py) and the CTC decoding of the recogniser's output.
"""

from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
from ocr_boxes import boxes_from_map
from ocr_image import cls_input, crop_quad, det_input, rec_input

DET = ("ocr_det", "x", "sigmoid_0.tmp_0")
CLS = ("ocr_cls", "x", "save_infer_model/scale_0.tmp_1")
REC = ("ocr_rec", "x", "softmax_11.tmp_0")
CHUNK = 32  # crops per classifier / recogniser call: the max_batch_size of ocr_cls and ocr_rec
CLS_THRESH = 0.9  # turn a crop over only when the classifier is this sure it is upside down
TEXT_SCORE = 0.5  # drop lines the recogniser is less confident about (RapidOCR's default)


class StepError(Exception):
    """A composing model answered with an error; it becomes this request's error."""


class TritonPythonModel:
    def initialize(self, args):
        keys = Path(args["model_repository"]) / "ppocr_keys.txt"
        if not keys.is_file():
            raise pb_utils.TritonModelException(f"{keys} is missing: run examples/prepare.py")
        # CTC class 0 is the blank; the dictionary follows, then the space PP-OCR appends.
        self.charset = ["", *keys.read_text(encoding="utf-8").split("\n")[:-1], " "]

    def execute(self, requests):
        return [self.handle(request) for request in requests]

    def handle(self, request):
        image = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy()
        if image.shape[0] < 1 or image.shape[1] < 1:
            error = f"IMAGE must be at least 1x1 pixels, got shape {list(image.shape)}"
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(error, pb_utils.TritonError.INVALID_ARG))
        try:
            lines, boxes, scores = self.read(image)
        except StepError as error:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error)))
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("TEXT", np.array([t.encode("utf-8") for t in lines], dtype=np.object_)),
            pb_utils.Tensor("BOXES", boxes.reshape(-1, 4, 2).astype(np.int32)),
            pb_utils.Tensor("SCORES", np.asarray(scores, np.float32)),
        ])

    def read(self, image):
        """(lines, boxes [n, 4, 2], scores [n]) for one RGB image."""
        prob = call(DET, det_input(image))[0, 0]
        boxes, _ = boxes_from_map(prob, *image.shape[:2])
        if len(boxes) == 0:
            return [], boxes, []
        crops = [crop_quad(image, box) for box in boxes]
        crops = self.upright(crops)
        texts, scores = self.recognise(crops)
        keep = [i for i, s in enumerate(scores) if s >= TEXT_SCORE]
        return [texts[i] for i in keep], boxes[keep], [scores[i] for i in keep]

    def upright(self, crops):
        """The crops, each turned 180 degrees where the direction classifier says it is upside down."""
        probs = np.concatenate([call(CLS, cls_input(crops[i:i + CHUNK])) for i in range(0, len(crops), CHUNK)])
        flipped = (probs.argmax(axis=1) == 1) & (probs[:, 1] > CLS_THRESH)
        return [c[::-1, ::-1] if flip else c for c, flip in zip(crops, flipped, strict=True)]

    def recognise(self, crops):
        """Text and confidence per crop; crops of similar width share a call so padding stays small."""
        order = sorted(range(len(crops)), key=lambda i: crops[i].shape[1] / crops[i].shape[0])
        texts, scores = [""] * len(crops), [0.0] * len(crops)
        for start in range(0, len(order), CHUNK):
            chunk = order[start:start + CHUNK]
            probs = call(REC, rec_input([crops[i] for i in chunk]))
            for i, row in zip(chunk, probs, strict=True):
                texts[i], scores[i] = self.ctc_decode(row)
        return texts, scores

    def ctc_decode(self, probs):
        """Greedy CTC: best class per time step, repeats merged, blanks dropped; score = mean kept probability."""
        best = probs.argmax(axis=1)
        keep = np.ones(len(best), bool)
        keep[1:] = best[1:] != best[:-1]
        keep &= best != 0
        text = "".join(self.charset[c] for c in best[keep])
        score = float(probs.max(axis=1)[keep].mean()) if keep.any() else 0.0
        return text, score


def call(step, array):
    """Run one composing model on ``array`` and return its single output as numpy."""
    model, input_name, output_name = step
    response = pb_utils.InferenceRequest(
        model_name=model, inputs=[pb_utils.Tensor(input_name, np.ascontiguousarray(array, np.float32))],
        requested_output_names=[output_name]).exec()
    if response.has_error():
        raise StepError(f"{model}: {response.error().message()}")
    return pb_utils.get_output_tensor_by_name(response, output_name).as_numpy()
