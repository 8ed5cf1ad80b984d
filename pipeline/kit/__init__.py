"""The Kit: a notebook API over the pipeline's parts (presets, dataloaders, metrics, mixed precision, search).

    from pipeline.kit import create_model_config, create_mlm_dataloader, AMPTrainer
"""

from pipeline.hub.retrieval.search_index import SearchIndex
from pipeline.kit.amp import AMPTrainer
from pipeline.kit.dataloaders import create_classification_dataloader, create_mlm_dataloader, read_texts
from pipeline.kit.metrics import compute_confusion_matrix, compute_precision_recall_f1, evaluate_classification_metrics
from pipeline.kit.presets import count_parameters, create_model_config, get_preset, list_model_configs

__all__ = ["AMPTrainer", "compute_confusion_matrix", "compute_precision_recall_f1", "count_parameters",
           "create_classification_dataloader", "create_mlm_dataloader", "create_model_config",
           "evaluate_classification_metrics", "get_preset", "list_model_configs", "read_texts", "SearchIndex"]
