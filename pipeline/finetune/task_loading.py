"""A fine-tuning config's task, read: GLUE (a folder or `datasets`), custom files, token tagging, QA or embeddings.

Kept apart from the trainer so that what needs only the data (the token-count baseline) loads no
model library.
"""

from __future__ import annotations

from pipeline.data.tasks.catalog import QA_TASKS, TOKEN_TASKS, task_spec
from pipeline.data.tasks.splits import Split, TaskData, load_custom, load_glue_folder, load_hf_glue
from pipeline.finetune.config import FinetuneConfig
from pipeline.finetune.families.embedding.config import EMBEDDING_TASKS


def load_task(config: FinetuneConfig) -> TaskData:
    from pipeline.finetune.families.qa.family import load_qa_task
    from pipeline.finetune.families.token.family import load_token_task

    d = config.data
    if config.task in EMBEDDING_TASKS:
        from pipeline.finetune.families.embedding.family import load_embedding_task

        return load_embedding_task(config)
    if config.task in TOKEN_TASKS:
        return load_token_task(config.task, d)
    if config.task in QA_TASKS:
        return load_qa_task(config.task, d)
    if config.task == "custom":
        data = load_custom(d.train_file, d.validation_file, d.test_file, d.text_fields, d.label_field, d.task_type,
                           d.labels)
    else:
        spec = task_spec(config.task)
        data = load_hf_glue(spec) if d.use_datasets and not d.glue_dir else load_glue_folder(spec, d.glue_dir)
    if d.max_train_examples:
        t = data.train
        n = d.max_train_examples
        data.train = Split(t.source, t.texts[:n], t.labels[:n] if t.labels is not None else None, t.ids[:n])
    return data
