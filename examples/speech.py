"""Synthetic speech for the VAD example and its test: espeak-ng through ctypes, from the
``espeakng-loader`` wheel (it bundles libespeak-ng and its voice data, so no system package is
needed), resampled to 16 kHz mono float32 in [-1, 1].

    pip install espeakng-loader==0.2.4
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

ESPEAK_PIP_NAME = "espeakng-loader==0.2.4"
_AUDIO_OUTPUT_SYNCHRONOUS = 2  # espeak_AUDIO_OUTPUT: samples go to the callback, Synth returns when done
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)
_lock = threading.Lock()  # libespeak-ng is one global synthesizer
_library: tuple[ctypes.CDLL, int] | None = None


def _espeak() -> tuple[ctypes.CDLL, int]:
    """The initialised library and its output sample rate (loaded once)."""
    global _library
    if _library is None:
        import espeakng_loader

        lib = ctypes.CDLL(espeakng_loader.get_library_path())
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_SetSynthCallback.argtypes = [_CALLBACK]
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_Synth.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int, ctypes.c_uint,
                                     ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
        rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, espeakng_loader.get_data_path().encode(), 0)
        if rate <= 0:
            raise RuntimeError(f"espeak_Initialize failed ({rate})")
        _library = (lib, rate)
    return _library


def synthesize(text: str, sample_rate: int = 16000, voice: str = "en") -> np.ndarray:
    """`text` spoken by espeak-ng, as float32 samples at `sample_rate`."""
    with _lock:
        lib, native_rate = _espeak()
        chunks: list[np.ndarray] = []

        def collect(wav: ctypes.POINTER(ctypes.c_short), count: int, events: int) -> int:
            if count > 0:
                chunks.append(np.ctypeslib.as_array(wav, shape=(count,)).copy())
            return 0  # go on

        callback = _CALLBACK(collect)  # kept alive until Synth returns
        lib.espeak_SetSynthCallback(callback)
        if lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise RuntimeError(f"espeak-ng has no voice '{voice}'")
        data = text.encode() + b"\0"
        status = lib.espeak_Synth(data, len(data), 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None)
        if status != 0:
            raise RuntimeError(f"espeak_Synth failed ({status})")
        lib.espeak_Synchronize()
    samples = np.concatenate(chunks).astype(np.float32) / 32768.0 if chunks else np.zeros(0, np.float32)
    return resample(samples, native_rate, sample_rate)


def resample(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    """Band-limited resampling through the spectrum (numpy only: no scipy needed)."""
    if rate == target or samples.size == 0:
        return samples.astype(np.float32)
    count = round(samples.size * target / rate)
    spectrum = np.fft.rfft(samples)
    kept = np.zeros(count // 2 + 1, dtype=spectrum.dtype)
    n = min(kept.size, spectrum.size)
    kept[:n] = spectrum[:n]
    return (np.fft.irfft(kept, count) * (count / samples.size)).astype(np.float32)
