"""Corpus construction, dataset loaders, robustness variants, test-suite databases, validation."""
