"""``SubjectIndex`` (#23): the streams that capture a subject and those whose subjects overlap a
filter, found by walking tokens, answer exactly what testing every filter with
``subject_matches`` and ``subjects_overlap`` answers (what routing and the create check did before)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from storage_delta.format.nats import SubjectIndex, subject_matches, subjects_overlap

TOKENS = st.sampled_from(["a", "b", "c"])
FILTER_TOKENS = st.sampled_from(["a", "b", "c", "*"])


@st.composite
def filters(draw: st.DrawFn) -> str:
    toks = draw(st.lists(FILTER_TOKENS, min_size=1, max_size=4))
    if draw(st.booleans()):
        toks.append(">")
    return ".".join(toks)


SUBJECTS = st.lists(TOKENS, min_size=1, max_size=5).map(".".join)


@settings(max_examples=300, deadline=None)
@given(
    held=st.lists(filters(), max_size=12),
    gone=st.sets(st.integers(0, 11)),
    subject=SUBJECTS,
    probe=filters(),
)
def test_index_answers_as_every_filter_tested_in_turn(
    held: list[str], gone: set[int], subject: str, probe: str
) -> None:
    index = SubjectIndex()
    for i, flt in enumerate(held):
        index.add(flt, f"s{i}")
    for i in gone:
        if i < len(held):
            index.remove(held[i], f"s{i}")
    live = {f"s{i}": flt for i, flt in enumerate(held) if i not in gone}
    assert index.matching(subject) == {n for n, f in live.items() if subject_matches(f, subject)}
    assert index.overlapping(probe) == {n for n, f in live.items() if subjects_overlap(f, probe)}


def test_removing_the_last_filter_leaves_an_empty_index() -> None:
    index = SubjectIndex()
    index.add("orders.*.eu", "A")
    index.add("orders.>", "B")
    index.remove("orders.*.eu", "A")
    index.remove("orders.>", "B")
    index.remove("never.added", "C")
    assert index.matching("orders.x.eu") == set()
    assert index.overlapping(">") == set()
    assert not index._root.next  # no level of a stream that is gone stays behind
