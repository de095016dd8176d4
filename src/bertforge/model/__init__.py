"""The BERT / RoBERTa model: `build_model(config, task)`, the task-head table, Hugging Face interop, FLOPs."""

from bertforge.model.bert import BertEncoderModel, BertForTask, build_model
from bertforge.model.config import MODEL_PRESETS, BertConfig
from bertforge.model.heads import TASK_HEADS, ModelOutput

__all__ = ["BertConfig", "BertEncoderModel", "BertForTask", "MODEL_PRESETS", "ModelOutput", "TASK_HEADS", "build_model"]
