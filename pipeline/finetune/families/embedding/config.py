"""The fine-tuning config's `embedding` section, and which tasks are embedding tasks.

Read by the embedding family alone; every other family ignores the section. It imports nothing of the
fine-tuning package, so `finetune/config.py` can hold it without an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.common.config import size_limits as lim
from pipeline.common.config.tree import refuse
from pipeline.data.tasks.corpus_pairs import CorpusPairsConfig
from pipeline.finetune.families.embedding.options import HardNegatives, Prompts
from pipeline.models.architectures.config import Pooling

EMBEDDING_TASKS = ("embed-pairs", "embed-sts", "embed-simcse", "embed-sparse", "embed-corpus")
"""`embed-pairs`: jsonl of `query`, `positive` and an optional `negative`; `embed-sts`: `sentence1`, `sentence2`,
`score`; `embed-simcse`: `text` only (unsupervised, dropout is the augmentation); `embed-sparse`: `embed-pairs`'
files, trained as SPLADE (sparse vectors from the masked-LM head); `embed-corpus`: a raw corpus (what
`data_prep/shard.py` reads), pairs mined from its documents (`embedding.corpus`)."""



@dataclass
class EmbeddingConfig:
    pooling: Pooling = "mean"
    """How token vectors become one embedding: `mean` over the real tokens, or the first (`cls`) token's. Written
    into the Sentence-Transformers folder (`1_Pooling/config.json`)."""
    score_range: list[float] = field(default_factory=lambda: [0.0, 5.0])
    """`embed-sts`: the scores' declared range (STS-B: 0 to 5); a score outside it is an error naming its line."""
    scale: float = 20.0
    """The in-batch loss's inverse temperature on cosine similarities (sentence-transformers' default, 1/0.05)."""
    cache_mini_batch: int | None = None
    """Cached in-batch negatives (GradCache, Gao et al. 2021): embeddings are computed this many examples at a time,
    so `train.batch_size` (the number of in-batch negatives) can exceed what fits in memory. None: plain in-batch."""

    max_steps: int | None = None
    """Stop after this many optimizer steps (the last epoch scored where it stops); None: `train.epochs` whole
    epochs. A short corpus stage before supervised pairs needs only a few hundred."""
    corpus: CorpusPairsConfig = field(default_factory=CorpusPairsConfig)
    """`embed-corpus` only: the corpus's keys and the pairs mined from it (`data/tasks/corpus_pairs.py`)."""

    dropout: float | None = None
    """Dropout set on every dropout of the model's config while fine-tuning; None: the model's own. SimCSE needs
    some (its only augmentation): the SimCSE paper's 0.1."""
    hard_negatives: HardNegatives = field(default_factory=HardNegatives)
    """`embed-pairs`: mined hard negatives for the pairs without one (`options.HardNegatives`); off by default."""
    matryoshka_dims: list[int] | None = None
    """Train the loss at these widths too (sentence-transformers' `MatryoshkaLoss`, the full width always included),
    and score the main figure at each (`ndcg_at_10@64`); each must be ≤ the model's width. None: off."""
    prompts: Prompts = field(default_factory=Prompts)
    """Text put before queries (`query`) and documents (`document`) in training, scoring and the saved folder."""
    query_regularizer_weight: float = 5e-5
    """`embed-sparse`: the FLOPS regulariser's weight on query vectors (sparsity; sentence-transformers' SPLADE
    default), reached after a third of the steps (its regulariser scheduler)."""
    document_regularizer_weight: float = 3e-5
    """`embed-sparse`: the FLOPS regulariser's weight on document vectors (positives and negatives)."""

    def __post_init__(self):
        problems = []
        if self.pooling not in ("mean", "cls"):
            problems.append(f"embedding.pooling: expected 'mean' or 'cls', got {self.pooling!r}")
        if len(self.score_range) != 2 or not self.score_range[0] < self.score_range[1]:
            problems.append(f"embedding.score_range: expected [low, high] with low < high, got {self.score_range}")
        if not self.scale > 0:
            problems.append(f"embedding.scale: must be > 0, got {self.scale}")
        if self.cache_mini_batch is not None and self.cache_mini_batch < 1:
            problems.append(f"embedding.cache_mini_batch: must be ≥ 1 (or null), got {self.cache_mini_batch}")
        if self.max_steps is not None and self.max_steps < 1:
            problems.append(f"embedding.max_steps: must be ≥ 1 (or null), got {self.max_steps}")
        if self.dropout is not None and not 0 <= self.dropout < 1:
            problems.append(f"embedding.dropout: must be in [0, 1) (or null), got {self.dropout}")
        dims = self.matryoshka_dims
        if dims is not None and (not dims or min(dims) < 1 or len(set(dims)) != len(dims)):
            problems.append(f"embedding.matryoshka_dims: expected distinct widths ≥ 1 (or null), got {dims}")
        for key in ("query_regularizer_weight", "document_regularizer_weight"):
            if not getattr(self, key) >= 0:
                problems.append(f"embedding.{key}: must be ≥ 0, got {getattr(self, key)}")
        problems += lim.bound_problems([("embedding.cache_mini_batch", self.cache_mini_batch, lim.MAX_MICRO_BATCH)],
                                       minimum=-(1 << 62))
        refuse(self, problems)
