"""What the models are built of beyond torch: paged attention, the sampler, prepacked and
quantized linear layers (and the calibration that chooses their float16 columns).
"""
