"""Sizes of the built-in data sets that are known without loading them: what the memory estimate
(common/memory.py) and the loaders (common/data.py) both read, so neither imports the other."""

SYNTHETIC_TEST_SAMPLES = 256   # at most: a quarter of --synthetic_samples, at least 8
CLICK_FEATURES = 4              # categorical features per example (user, item, context, ...)
