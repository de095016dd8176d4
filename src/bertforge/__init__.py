"""bertforge: BERT pre-training and fine-tuning on PyTorch."""

__version__ = "0.1.0"
