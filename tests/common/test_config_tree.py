"""The config tree builds lists of small objects, and names the item and key of each problem in them."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.common.config_tree import build_config, to_dict


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
