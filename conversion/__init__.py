"""Converters from original checkpoints to hf_txvariants models. See conversion/README.md.

* ``python -m conversion.kimiyoung_tf``       kimiyoung/transformer-xl TensorFlow checkpoints (no TensorFlow needed)
* ``python -m conversion.kimiyoung_pytorch``  models saved by kimiyoung/transformer-xl pytorch/train.py
* ``python -m conversion.evaluate``           evaluate a converted Transformer-XL the paper's way
"""
