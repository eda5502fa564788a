"""The served stream in-process: prefetch never changes it, cursors resume it, retries repeat it."""

import json

import pytest
from support.jsonl import write_jsonl

from rollway.common.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument, ResourceExhausted
from rollway.dataloader.datasets import open_sources
from rollway.dataloader.encoder import Encoder, load_tokenizer
from rollway.dataloader.rows import RowRules
from rollway.dataloader.sources import parse_sources
from rollway.dataloader.stream import DataStream, StreamSettings

RULES = RowRules(input_key="prompt", label_key="label", apply_chat_template=True)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(str(tiny_model_dir))


@pytest.fixture
def make_stream(tmp_path, tokenizer):
    streams = []
    a = write_jsonl(
        tmp_path / "a.jsonl", [{"prompt": f"What is {i} + 1?", "label": f"a{i}"} for i in range(13)]
    )
    b = write_jsonl(
        tmp_path / "b.jsonl", [{"prompt": f"Xylophone zebra {i} quux", "label": f"b{i}"} for i in range(7)]
    )

    def make(
        weights=None,
        prefetch_size=8,
        num_epoch=2,
        max_len=0,
        skip=False,
        paths=(a, b),
        rules=RULES,
        tok=None,
        max_message_bytes=2**26,
    ):
        specs = parse_sources(["a", paths[0], "b", paths[1]], weights)
        sources = open_sources(specs, rules, tmp_path / f"cache{len(streams)}", skip_bad_rows=skip)
        settings = StreamSettings(
            "rl",
            weights,
            seed=5,
            shuffle=True,
            num_epoch=num_epoch,
            max_len=max_len,
            skip_bad_rows=skip,
            prefetch_size=prefetch_size,
            max_message_bytes=max_message_bytes,
        )
        stream = DataStream(sources, Encoder(tok or tokenizer, sft=False, apply_chat_template=True), settings)
        streams.append((stream, sources))
        return stream

    yield make
    for stream, sources in streams:
        stream.close()
        for source in sources:
            source.close()


def labels(response):
    return [item.label for item in response.items]


def serve(stream, sizes, first_id=0):
    return [labels(stream.next_batch(first_id + i, size, timeout=30)) for i, size in enumerate(sizes)]


@pytest.mark.parametrize("weights", [None, [0.6, 0.4]])
def test_prefetch_size_does_not_change_the_stream(make_stream, weights):
    sizes = [3, 5, 1, 8, 4, 7, 6]
    reference = serve(make_stream(weights, prefetch_size=0), sizes)
    assert serve(make_stream(weights, prefetch_size=64), sizes) == reference
    assert serve(make_stream(weights, prefetch_size=2), sizes) == reference


# After 2 batches: mid-epoch; after 4 batches: exactly one epoch (20 rows).
@pytest.mark.parametrize("weights", [None, [0.3, 0.7]])
@pytest.mark.parametrize("cut", [2, 4])
def test_restore_continues_exactly_despite_prefetched_items(make_stream, cut, weights):
    sizes = [5] * 8
    full = serve(make_stream(weights, prefetch_size=16), sizes)
    first = make_stream(weights, prefetch_size=16)
    serve(first, sizes[:cut])
    state_json, num_batches, epoch = first.get_state()
    assert (num_batches, epoch) == (cut, 1 if cut == 4 else 0)
    resumed = make_stream(weights, prefetch_size=3)
    assert resumed.restore(state_json) == epoch
    assert serve(resumed, sizes[cut:], first_id=cut) == full[cut:]
    assert resumed.counters()["items_served"] == 40
    # The first stream continues as if nothing happened: GetState took nothing from it.
    assert serve(first, sizes[cut:], first_id=cut) == full[cut:]


def test_epochs_wrap_and_the_stream_ends_after_num_epoch(make_stream):
    stream = make_stream(num_epoch=2)
    batches = [stream.next_batch(i, 15, timeout=30) for i in range(3)]
    assert [len(b.items) for b in batches] == [15, 15, 10]
    assert [b.exhausted for b in batches] == [False, False, True]
    assert sorted(labels(batches[0]) + labels(batches[1])[:5]) == sorted(
        [f"a{i}" for i in range(13)] + [f"b{i}" for i in range(7)]
    )
    assert {item.epoch for item in batches[1].items[5:]} == {1}
    after = stream.next_batch(3, 4, timeout=30)
    assert (len(after.items), after.exhausted, after.epoch) == (0, True, 2)


def test_a_retried_batch_id_returns_the_same_batch(make_stream):
    stream = make_stream()
    first = stream.next_batch(0, 4, timeout=30)
    assert stream.next_batch(0, 4, timeout=30) == first
    second = stream.next_batch(1, 4, timeout=30)
    assert labels(second) != labels(first)
    assert stream.next_batch(0, 4, timeout=30) == first  # still cached
    with pytest.raises(InvalidArgument, match="batch_size"):
        stream.next_batch(1, 5, timeout=30)
    for batch_id in range(2, 7):
        stream.next_batch(batch_id, 1, timeout=30)
    with pytest.raises(InvalidArgument, match=r"batch_id: 0 is outside .* retry of batch_id 3\.\.6"):
        stream.next_batch(0, 4, timeout=30)


@pytest.mark.parametrize("bad_id", [-1, 10**12, 4, 8])
def test_a_batch_id_outside_the_expected_range_is_refused_and_changes_nothing(make_stream, bad_id):
    reference = serve(make_stream(), [3] * 6)
    stream = make_stream()
    assert serve(stream, [3] * 3) == reference[:3]
    state = stream.get_state()
    with pytest.raises(InvalidArgument) as info:
        stream.next_batch(bad_id, 3, timeout=30)
    assert str(info.value) == (
        f"batch_id: {bad_id} is outside the expected range: expected the next batch_id 3 "
        "or a retry of batch_id 0..2 (the last 3 served)"
    )
    assert stream.get_state() == state
    assert serve(stream, [3] * 3, first_id=3) == reference[3:]


def test_after_restore_the_next_batch_id_is_the_restored_count(make_stream):
    first = make_stream()
    serve(first, [2, 2])
    resumed = make_stream()
    resumed.restore(first.get_state()[0])
    with pytest.raises(InvalidArgument, match="expected the next batch_id 2$"):
        resumed.next_batch(0, 2, timeout=30)  # the cache did not travel: batch 0 is not replayed
    assert labels(resumed.next_batch(2, 2, timeout=30)) == labels(first.next_batch(2, 2, timeout=30))


def test_too_long_prompts_are_dropped_and_counted(make_stream, tokenizer):
    def length(prompt):
        return len(
            tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)[
                "input_ids"
            ]
        )

    max_len = length("What is 12 + 1?")  # every "a" prompt fits, no "b" prompt (spelled out in bytes) does
    assert length("Xylophone zebra 1 quux") > max_len
    stream = make_stream(max_len=max_len, num_epoch=1)
    response = stream.next_batch(0, 100, timeout=30)
    assert sorted(labels(response)) == sorted(f"a{i}" for i in range(13))
    assert response.exhausted
    assert response.counters["dropped_too_long"] == 7
    assert response.counters["dropped_too_long/b"] == 7 and response.counters["items_served/a"] == 13


def test_a_row_the_tokenizer_rejects_stops_the_stream_until_skipped(make_stream, tmp_path, tokenizer):
    rows = [{"prompt": f"q{i}", "label": str(i)} for i in range(6)]
    rows[4]["prompt"] = "FORBIDDEN"
    bad = write_jsonl(tmp_path / "bad.jsonl", rows)
    tok = load_tokenizer(tokenizer.name_or_path)
    tok.chat_template = (
        "{% for m in messages %}{% if 'FORBIDDEN' in m.content %}{{ raise_exception('forbidden word') }}{% endif %}"
        "{{ m.content }}{% endfor %}"
    )
    one = write_jsonl(tmp_path / "one.jsonl", [{"prompt": "fine", "label": "x"}])
    stream = make_stream(paths=(bad, one), num_epoch=1, tok=tok, prefetch_size=0)
    served = []
    with pytest.raises(FailedPrecondition) as info:
        for batch_id in range(10):
            served += labels(stream.next_batch(batch_id, 1, timeout=30))
    assert f"{bad}: row 4: rejected by the chat template or tokenizer" in str(info.value)
    assert "forbidden word" in str(info.value)
    before = stream.get_state()[0]
    with pytest.raises(FailedPrecondition):  # the next call answers the same error, nothing consumed
        stream.next_batch(batch_id, 1, timeout=30)
    assert stream.get_state()[0] == before

    skipping = make_stream(paths=(bad, one), num_epoch=1, tok=tok, skip=True)
    response = skipping.next_batch(0, 10, timeout=30)
    assert sorted(labels(response)) == ["0", "1", "2", "3", "5", "x"]
    assert response.counters["rejected_by_tokenizer"] == 1 and response.counters["skipped_bad_rows"] == 1


def test_restore_refuses_foreign_or_broken_states(make_stream):
    stream = make_stream()
    state = json.loads(stream.get_state()[0])
    with pytest.raises(InvalidArgument, match="not valid JSON"):
        stream.restore("{")
    with pytest.raises(InvalidArgument, match="version"):
        stream.restore(json.dumps({**state, "version": 99}))
    with pytest.raises(FailedPrecondition, match="taken with sources"):
        stream.restore(json.dumps({**state, "sources": state["sources"][:1]}))
    with pytest.raises(FailedPrecondition, match="taken with weights"):
        stream.restore(json.dumps({**state, "weights": [0.5, 0.5]}))
    with pytest.raises(InvalidArgument, match="bad cursor"):
        stream.restore(json.dumps({**state, "cursor": {"epoch": 0, "offset": 999}}))
    with pytest.raises(InvalidArgument, match="seed"):
        stream.restore(json.dumps({**state, "seed": "x"}))
    assert len(stream.next_batch(0, 3, timeout=30).items) == 3  # still serving


def test_a_late_or_oversized_batch_consumes_nothing(make_stream):
    reference = serve(make_stream(prefetch_size=0), [4, 4])
    stream = make_stream(prefetch_size=0, max_message_bytes=4000)
    with pytest.raises(DeadlineExceeded, match="retry the same batch_id"):
        stream.next_batch(0, 4, timeout=0)
    with pytest.raises(ResourceExhausted, match="over the 0 MiB message limit; ask for fewer items"):
        stream.next_batch(0, 40, timeout=30)
    assert stream.counters()["items_served"] == 0
    assert serve(stream, [4, 4]) == reference
