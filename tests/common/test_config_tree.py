"""The config tree builds lists of small objects, names the item and key of each problem in them, and
collects what each section's own `__post_init__` refuses with the rest."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from pipeline.common.config.tree import SectionProblems, build_config, build_tree, refuse, to_dict


@dataclass
class Source:
    path: str = ""
    weight: float = 1.0


@dataclass
class Section:
    sources: str | list[Source] = ""
    tags: list[str] = field(default_factory=list)


@dataclass
class Root:
    data: Section = field(default_factory=Section)


def test_a_union_of_a_string_and_a_list_of_objects_takes_either():
    config, problems = build_config(Root, {"data": {"sources": "one/folder"}})
    assert problems == [] and config.data.sources == "one/folder"
    config, problems = build_config(Root, {"data": {"sources": [{"path": "a", "weight": 3}, {"path": "b"}]}})
    assert problems == []
    assert config.data.sources == [Source("a", 3.0), Source("b", 1.0)]
    assert isinstance(config.data.sources[0].weight, float)
    assert to_dict(config) == {"data": {"sources": [{"path": "a", "weight": 3.0}, {"path": "b", "weight": 1.0}],
                                        "tags": []}}


def test_problems_inside_list_items_name_the_item_and_the_key():
    _, problems = build_config(Root, {"data": {"sources": [{"path": "a", "weight": "heavy"},
                                                           {"path": "b", "wieght": 1}, 7]}})
    assert 'data.sources[0].weight: expected a number, got "heavy"' in problems
    assert any(p.startswith("data.sources[1].wieght: unknown key (known in data.sources[1]: path, weight)")
               for p in problems)
    assert "data.sources[2]: expected an object, got 7" in problems
    assert len(problems) == 3


def test_a_value_of_neither_kind_says_both_kinds_are_accepted():
    _, problems = build_config(Root, {"data": {"sources": 5, "tags": ["x", 1]}})
    assert sorted(problems) == ["data.sources: expected string or list of {path, weight} objects, got 5",
                                'data.tags: expected a list of strings, got ["x", 1]']


@dataclass
class Limits:
    low: int = 0
    high: int = 10

    def __post_init__(self):
        refuse(self, [f"limits.low {self.low} must be below limits.high {self.high}"] if self.low >= self.high else [])


@dataclass
class Run:
    limits: Limits = field(default_factory=Limits)
    steps: int = 5

    def __post_init__(self):  # a rule between sections: it sees the values of a section that refused its own
        refuse(self, [f"steps {self.steps} must be at least limits.low {self.limits.low}"]
               if self.steps < self.limits.low else [])


def test_a_sections_own_problems_come_with_the_others_and_the_section_is_kept_as_built():
    config, wrong, refused = build_tree(Run, {"limits": {"low": 20, "high": 3, "extra": 1}, "steps": 7})
    assert wrong == ["limits.extra: unknown key (known in limits: high, low)"]
    assert refused == ["limits.low 20 must be below limits.high 3", "steps 7 must be at least limits.low 20"]
    assert (config.limits.low, config.steps) == (20, 7)
    assert build_config(Run, {"limits": {"low": 20, "high": 3}})[1] == refused[:1] + [
        "steps 5 must be at least limits.low 20"]


def test_a_section_left_out_or_of_the_wrong_kind_is_still_checked():
    @dataclass
    class Strict:
        limits: Limits = field(default_factory=lambda: Limits(low=10))  # a default its own check refuses

    assert build_config(Strict, {})[1] == ["limits.low 10 must be below limits.high 10"]
    assert build_config(Run, {"limits": 3})[1] == ["limits: expected an object, got 3"]


def test_a_section_built_directly_raises_its_problems_as_a_value_error():
    with pytest.raises(ValueError, match="limits.low 4 must be below limits.high 2") as err:
        Limits(low=4, high=2)
    assert isinstance(err.value, SectionProblems) and err.value.problems == ["limits.low 4 must be below limits.high 2"]
