"""Generation: decoders whose structure the model decides, run on the device (``fold/generation/generator.py``)."""
