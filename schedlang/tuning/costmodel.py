"""A learned cost model: rank candidate knob points before building them.

Building a candidate costs a second or more; checking and lowering it costs tens of milliseconds.
So the tuner draws a pool of points (several per slot of a batch) from its usual search, lowers
each without building it, describes the lowered TIR with TVM's per-store feature extractor
(`s_tir.meta_schedule`'s PerStoreFeature: loop structure, arithmetic, memory access and reuse of
every buffer store), and asks gradient-boosted trees (LightGBM) trained on the run's measured
records — and the database's earlier ones for the same op and target — which points will be
fastest. Most of the batch is the model's top picks; an exploration share is drawn at random from
the rest of the pool, so that the model also learns about points it rates low.

    model = CostModel(op, target, seed=0, log=print)
    model.observe(record)                       # each measured Record
    if model.ready():
        picks = model.pick(schedules, count=8, rng=random.Random(0))

With too few verified records (`min_records`) the model stays out and the tuner's own search
decides. Everything is deterministic given the seed and the records: LightGBM runs on one thread
with its deterministic mode, and every pick is logged (`log`) with its predicted GFLOP/s.

The target the trees learn is log(GFLOP/s), so that a 2x gap counts the same at any speed.
Records that failed (check, build, run, wrong result) are left out: they have no throughput.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

import numpy as np

from schedlang.core.diagnostics import SchedlangError

if TYPE_CHECKING:
    from schedlang.core.ops import Op
    from schedlang.core.target import Target
    from schedlang.lang import nodes
    from schedlang.store.records import Record

CHOICES = ("auto", "off", "lightgbm")
# A point predicted under a tenth of the best measured GFLOP/s is not built: in the 1,000-trial
# ResNet-18 run of issue 48, 399 of 894 candidates ran more than ten times their task's best.
FAR_WORSE = 10.0
STORE_FEATURES = 164  # PerStoreFeature's vector per buffer store (extract_workload=False)


def lightgbm_available() -> bool:
    return find_spec("lightgbm") is not None


def resolve(choice: str) -> tuple[bool, str | None]:
    """(use the model?, a one-line note for the user or None) for a `--cost-model` value.

    "auto" uses LightGBM when it is installed and falls back to the plain search (with a note)
    when it is not; "lightgbm" insists on it; "off" never uses a model."""
    if choice not in CHOICES:
        raise SchedlangError(
            f"unknown cost model `{choice}`",
            f"expected one of: {', '.join(CHOICES)}",
        )
    if choice == "off":
        return False, None
    if lightgbm_available():
        return True, None
    if choice == "auto":
        return False, (
            "no cost model: LightGBM is not installed (pip install 'schedlang[tune]'); "
            "the tuner searches without one"
        )
    raise SchedlangError(
        "the lightgbm cost model needs LightGBM, which is not installed",
        "pip install 'schedlang[tune]', or pass --cost-model auto (or off) to tune without it",
    )


# --- features ------------------------------------------------------------------------------------


class Featurizer:
    """Feature vectors of concrete schedules of one op, from their lowered TIR (never built).

    A schedule's vector is the sum and the maximum over its buffer stores of PerStoreFeature's
    164 values, and the number of stores: 329 numbers whatever the schedule's structure, so one
    model compares schedules of different templates. A schedule that fails its check has no
    vector (None). Vectors and lowered functions are cached by schedule text."""

    def __init__(self, op: Op, target: Target, cache_size: int = 4096):
        self.op, self.target = op, target
        self.cache: dict[str, np.ndarray | None] = {}
        # text -> lowered PrimFunc of the latest pool, for the measurer to reuse (not rebuild)
        self.lowered: dict[str, Any] = {}
        self.cache_size = cache_size
        self.seconds = 0.0  # spent lowering and extracting, for the cost report
        self.count = 0  # schedules lowered and extracted (cache misses)
        # TVM's feature extractor and its tuning context, made on first use (TVM is untyped).
        self._extractor: Any = None
        self._context: Any = None
        # text -> a function already lowered elsewhere (a search.Screen's), or None
        self.known: Callable[[str], Any] | None = None

    def _setup(self) -> None:
        from tvm.s_tir import meta_schedule as ms
        from tvm.s_tir.meta_schedule import _ffi_api

        self._extractor = ms.feature_extractor.PerStoreFeature(extract_workload=False)
        # TuneContext's Python constructor imports tvm.s_tir.tensor_intrin first, which takes
        # from 30 s to minutes on these machines; the extractor reads only the target, so the
        # object is made with the FFI constructor directly.
        context = ms.TuneContext.__new__(ms.TuneContext)
        context.__init_handle_by_constructor__(
            _ffi_api.TuneContext, None, self.target.to_tvm(), None, None, "main", 1, 0, None
        )
        self._context = context

    def features(
        self, schedule: nodes.Schedule, text: str, keep_lowered: bool = False
    ) -> np.ndarray | None:
        """The schedule's vector; with `keep_lowered`, its lowered function is kept for
        `take_lowered` (a pool's points: the picked ones are measured next)."""
        if text in self.cache:
            return self.cache[text]
        started = time.perf_counter()
        vector = None
        func = self.known(text) if self.known is not None else None
        func = func if func is not None else self._lower(schedule)
        if func is not None:
            vector = self._extract(func)
            if keep_lowered and len(self.lowered) < 256:  # a pool's: picks are taken at once
                self.lowered[text] = func
        self.seconds += time.perf_counter() - started
        self.count += 1
        if len(self.cache) < self.cache_size:
            self.cache[text] = vector
        return vector

    def take_lowered(self, text: str):
        """The lowered function of `text` if this featurizer lowered it (once: it is dropped)."""
        return self.lowered.pop(text, None)

    def _lower(self, schedule: nodes.Schedule):
        from schedlang.checker.check import check

        try:
            result = check(schedule, self.op.func, self.target, template_ok=False)
        except SchedlangError:
            return None
        return None if result.lowered is None else result.lowered.func

    def _extract(self, func) -> np.ndarray | None:
        import tvm
        from tvm.s_tir import Schedule
        from tvm.s_tir import meta_schedule as ms

        if self._extractor is None:
            self._setup()
        try:
            candidate = ms.MeasureCandidate(
                Schedule(tvm.IRModule({"main": func})),
                ms.arg_info.ArgInfo.from_prim_func(func),
            )
            [stores] = self._extractor.extract_from(self._context, [candidate])
            stores = stores.numpy()
        except tvm.TVMError:
            return None
        if stores.ndim != 2 or stores.shape[1] != STORE_FEATURES:
            return None
        if len(stores) == 0:
            stores = np.zeros((1, STORE_FEATURES))
        return np.concatenate([stores.sum(0), stores.max(0), [len(stores)]]).astype(np.float64)

    def cost_ms(self) -> float:
        """Mean milliseconds to lower and describe one schedule."""
        return 1000 * self.seconds / self.count if self.count else 0.0


# --- the model -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pick:
    index: int  # into the pool
    how: str  # why it was picked, for the run log
    predicted_gflops: float | None


class CostModel:
    """Gradient-boosted trees on log(GFLOP/s) of measured records; ranks pools of schedules."""

    def __init__(
        self,
        op: Op,
        target: Target,
        *,
        seed: int,
        log: Callable[[str], None],
        min_records: int = 8,
        explore: float = 0.25,
        history_limit: int = 256,
        far_worse: float | None = FAR_WORSE,
    ):
        self.featurizer = Featurizer(op, target)
        self.seed, self.log = seed, log
        self.min_records, self.explore, self.history_limit = min_records, explore, history_limit
        self.examples: list[tuple[str, float]] = []  # (schedule text, log GFLOP/s)
        self.texts: set[str] = set()
        self.earlier = 0  # examples from earlier runs
        self.booster: Any = None  # a lightgbm.Booster once fitted (lightgbm is optional)
        self.fitted_on = 0  # examples the booster was trained on
        self.fits = 0
        self.fit_seconds = 0.0
        self.far_worse = far_worse  # None: every point may be picked
        self.pruned: list[tuple[int, float]] = []  # the last pool's (index, predicted GFLOP/s)

    def observe(self, record: Record, *, earlier: bool = False) -> None:
        """Learn from a measured record (ok records only: a failure has no throughput)."""
        if not record.is_ok or not record.gflops or record.gflops <= 0:
            return
        if record.schedule in self.texts:
            return
        if earlier and self.earlier >= self.history_limit:
            return
        self.texts.add(record.schedule)
        self.examples.append((record.schedule, math.log(record.gflops)))
        self.earlier += earlier

    def best_gflops(self) -> float:
        """The best GFLOP/s it has learned from (0 before any)."""
        return math.exp(max(value for _, value in self.examples)) if self.examples else 0.0

    def ready(self) -> bool:
        return len(self.examples) >= self.min_records

    def status(self) -> str:
        return f"{len(self.examples)} verified records, needs {self.min_records}"

    def fit(self) -> bool:
        """Train on every example if there are new ones; False if too few have features."""
        if self.booster is not None and self.fitted_on == len(self.examples):
            return True
        import lightgbm

        from schedlang.lang.syntax import parse

        started = time.perf_counter()
        rows, targets = [], []
        for text, value in self.examples:
            try:
                schedule = parse(text, "<record>")
            except SchedlangError:
                continue
            vector = self.featurizer.features(schedule, text)
            if vector is not None:
                rows.append(vector)
                targets.append(value)
        if len(rows) < self.min_records:
            self.log(f"cost model: {len(rows)} records with features, needs {self.min_records}")
            return False
        params = {
            "objective": "regression",
            "learning_rate": 0.1,
            "num_leaves": 15,
            "min_data_in_leaf": 2,
            "min_data_in_bin": 1,
            "feature_fraction": 0.8,
            "bagging_fraction": 0.8,
            "bagging_freq": 1,
            "lambda_l2": 1.0,
            "seed": self.seed,
            "deterministic": True,
            "force_row_wise": True,
            "num_threads": 1,
            "verbose": -1,
        }
        data = lightgbm.Dataset(np.array(rows), np.array(targets), params={"verbose": -1})
        self.booster = lightgbm.train(params, data, num_boost_round=60)
        self.fitted_on = len(self.examples)
        self.fits += 1
        seconds = time.perf_counter() - started
        self.fit_seconds += seconds
        self.log(
            f"cost model: trained on {len(rows)} records ({self.earlier} from earlier runs) "
            f"in {1000 * seconds:.0f} ms; features {self.featurizer.cost_ms():.0f} ms a schedule"
        )
        return True

    def predict(self, vectors: Sequence[np.ndarray]) -> np.ndarray:
        """Predicted GFLOP/s of each feature vector."""
        assert self.booster is not None
        return np.exp(self.booster.predict(np.array(vectors), num_threads=1))

    def pick(
        self,
        schedules: Sequence[tuple[nodes.Schedule, str]],
        count: int,
        rng: random.Random,
    ) -> list[Pick] | None:
        """`count` of the pool's (schedule, text) pairs: the best predicted, and a share at random
        from the rest; none predicted under 1/`far_worse` of the best measured (those are in
        `pruned`, and the picks may be fewer than `count`). None if the model cannot rank (too
        few records with features)."""
        self.pruned = []
        if not schedules or not self.ready() or not self.fit():
            return None
        vectors = [self.featurizer.features(s, text, keep_lowered=True) for s, text in schedules]
        ranked = [i for i, v in enumerate(vectors) if v is not None]
        predicted: dict[int, float] = {}
        if ranked:
            features = [v for v in vectors if v is not None]  # those of `ranked`, in order
            predicted = dict(zip(ranked, self.predict(features), strict=True))
        if self.far_worse is not None:
            floor = self.best_gflops() / self.far_worse
            self.pruned = [(i, float(predicted[i])) for i in ranked if predicted[i] < floor]
            ranked = [i for i in ranked if predicted[i] >= floor]
        # Best first; ties by pool order, so the order is the same on every machine.
        ranked.sort(key=lambda i: (-predicted[i], i))
        unrankable = [i for i, v in enumerate(vectors) if v is None]  # fail their check: cheap
        count = min(count, len(schedules))
        explore = round(count * self.explore) if len(schedules) > count else 0
        picks = [
            Pick(i, f"model {rank + 1}/{len(schedules)}", float(predicted[i]))
            for rank, i in enumerate(ranked[: count - explore])
        ]
        chosen = {p.index for p in picks}
        rest = [i for i in ranked + unrankable if i not in chosen]
        for i in rng.sample(rest, min(explore, len(rest))):
            picks.append(Pick(i, "explore", predicted.get(i)))
        if len(picks) < count:  # a pool with too few rankable points
            chosen = {p.index for p in picks}
            picks += [Pick(i, "unranked", None) for i in rest if i not in chosen][
                : count - len(picks)
            ]
        chosen = {p.index for p in picks}
        for i, (_, text) in enumerate(schedules):  # only the picks are measured next
            if i not in chosen:
                self.featurizer.lowered.pop(text, None)
        return picks
