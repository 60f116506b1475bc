"""One headline figure: its value and unit, its target, what it is compared with, and pass/fail."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from bench.stats import ratio

PEER = "peer (FastAPI + LangGraph + ChatOpenAI)"
LANGGRAPH = "LangGraph dev server"


@dataclass
class Figure:
    key: str
    name: str
    value: float | None
    unit: str
    target: float | None = None  # the most the value may be (the least, with at_least)
    baselines: dict[str, float | None] = field(default_factory=dict)  # measured in this run
    peers: dict[str, float | None] = field(default_factory=dict)  # quoted figures of other systems
    note: str = ""
    group: str = "server"  # "server": the targets; "harness": whether the run measured well
    at_least: bool = False  # the target is a floor (a capacity to reach), not a ceiling

    @property
    def passed(self) -> bool | None:
        if self.target is None or self.value is None:
            return None
        return self.value >= self.target if self.at_least else self.value <= self.target

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["passed"] = self.passed
        data["ratios"] = {
            label: ratio(self.value, other) for label, other in {**self.baselines, **self.peers}.items()
        }
        return data


def get(data: Any, *path: Any) -> Any:
    for key in path:
        if data is None:
            return None
        if isinstance(key, int) and isinstance(data, list):
            data = data[key] if -len(data) <= key < len(data) else None
        elif isinstance(data, dict):
            data = data.get(key)
        else:
            return None
    return data
