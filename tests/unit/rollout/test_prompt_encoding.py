"""Text and message prompts: the served tokenizer's ids, and refusals that name the field."""

import pytest

from rollway.common.config import ConfigError
from rollway.common.errors import FailedPrecondition, InvalidArgument
from rollway.rollout.config import RolloutConfig
from rollway.rollout.engines.base import ModelInfo
from rollway.rollout.prompt_encoding import PromptEncoder, load_tokenizer
from rollway.rollout.request_validation import plan_generation
from rollway.rollout.v1 import rollout_pb2

USER = rollout_pb2.ChatMessage(role="user", content="What is 1 + 1?")


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(RolloutConfig(hf_checkpoint=str(tiny_model_dir)))


def _plan(prompts, tokenizer, max_context_len=1024):
    info = ModelInfo("m", len(tokenizer), max_context_len, frozenset({2}), "float32")
    request = rollout_pb2.GenerateRequest(prompts=prompts, n_samples_per_prompt=2, reward="none")
    return plan_generation(request, RolloutConfig(hf_checkpoint="m"), info, {}, PromptEncoder(tokenizer))


def test_text_and_messages_become_the_token_ids_of_every_sample(tokenizer):
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": USER.content}], tokenize=False,
                                             add_generation_prompt=True)  # fmt: skip
    plan = _plan([rollout_pb2.Prompt(text="Hello there"), rollout_pb2.Prompt(messages=[USER])], tokenizer)
    expected = [
        tuple(tokenizer("Hello there", add_special_tokens=False)["input_ids"]),
        tuple(tokenizer(rendered, add_special_tokens=False)["input_ids"]),
    ]
    assert plan.prompt_token_ids == expected
    assert [s.prompt_token_ids for s in plan.samples] == [expected[0]] * 2 + [expected[1]] * 2


def test_chat_template_path_replaces_the_template(tiny_model_dir, tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text(
        "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant] "
    )
    tokenizer = load_tokenizer(
        RolloutConfig(hf_checkpoint=str(tiny_model_dir), chat_template_path=str(template))
    )
    ids = PromptEncoder(tokenizer).encode_messages("prompts[0].messages", [USER])
    assert tokenizer.decode(list(ids)) == "[user] What is 1 + 1?\n[assistant] "
    with pytest.raises(ConfigError) as info:
        load_tokenizer(
            RolloutConfig(hf_checkpoint=str(tiny_model_dir), chat_template_path=str(tmp_path / "no"))
        )
    assert info.value.setting == "chat_template_path"


def test_template_refusals_and_a_missing_template_name_the_field(tiny_model_dir):
    tokenizer = load_tokenizer(RolloutConfig(hf_checkpoint=str(tiny_model_dir)))
    tokenizer.chat_template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(InvalidArgument) as refused:
        _plan([rollout_pb2.Prompt(text="a"), rollout_pb2.Prompt(messages=[USER])], tokenizer)
    assert refused.value.field == "prompts[1].messages" and "roles must alternate" in str(refused.value)
    tokenizer.chat_template = None
    with pytest.raises(FailedPrecondition) as missing:
        _plan([rollout_pb2.Prompt(messages=[USER])], tokenizer)
    assert str(missing.value).startswith("prompts[0].messages: ") and "--chat-template-path" in str(
        missing.value
    )


def test_prompt_errors_name_the_form_given(tokenizer):
    with pytest.raises(InvalidArgument) as long_text:
        _plan([rollout_pb2.Prompt(text="word " * 50)], tokenizer, max_context_len=16)
    assert long_text.value.field == "prompts[0].text" and "fills the model context" in str(long_text.value)
    with pytest.raises(FailedPrecondition) as no_tokenizer:
        request = rollout_pb2.GenerateRequest(prompts=[rollout_pb2.Prompt(text="a")], reward="none")
        info = ModelInfo("m", 100, 64, frozenset({2}), "float32")
        plan_generation(request, RolloutConfig(hf_checkpoint="m"), info, {})  # no encoder
    assert "prompts[0].text" in str(no_tokenizer.value)
