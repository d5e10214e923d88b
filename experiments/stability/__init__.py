"""How often IsoBN, BatchNorm and whitening return NaN/Inf on
ill-conditioned inputs: see `measurement.py`."""
