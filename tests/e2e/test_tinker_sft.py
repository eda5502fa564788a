"""The unmodified tinker SDK trains the tiny model through `rollway gateway`: an SFT loop.

Only base_url, the API key (the gateway's token) and the model name (a local model directory)
differ from a hosted run.
"""

from __future__ import annotations

import numpy as np
import pytest
import tinker
import torch
from support.gateway import TOKEN, running_gateway
from tinker import types
from transformers import AutoModelForCausalLM

pytestmark = pytest.mark.slow
TEXTS = ["1 + 2 = 3", "4 + 4 = 8", "2 + 5 = 7", "3 + 3 = 6"]
ADAM = types.AdamParams(learning_rate=1e-2, beta1=0.9, beta2=0.95, eps=1e-8)


def sft_datum(tokens: list[int]) -> types.Datum:
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with running_gateway(tmp_path_factory.mktemp("gw")) as (base_url, process):
        yield base_url, process


@pytest.fixture
def service(gateway):
    with tinker.ServiceClient(base_url=gateway[0], api_key=TOKEN) as client:  # closed: no stray heartbeats
        yield client


def test_sft_loss_falls_and_saved_weights_reload_in_transformers(gateway, service, tiny_model_dir):
    base_url, process = gateway
    training = service.create_lora_training_client(
        base_model=str(tiny_model_dir), rank=0
    ).result()  # rank 0: full fine-tuning
    tokenizer = training.get_tokenizer()
    data = [sft_datum(tokenizer.encode(text)) for text in TEXTS]
    losses = []
    for _ in range(6):
        fwd_bwd = training.forward_backward(data, "cross_entropy")
        optim = training.optim_step(ADAM)
        result = fwd_bwd.result()
        losses.append(result.metrics["loss:sum"])
        assert optim.result().metrics["train/lr"] == pytest.approx(1e-2)
    assert losses[-1] < 0.5 * losses[0], losses
    # The per-token log-probs returned add up to the loss.
    logprobs = [out["logprobs"].to_numpy() for out in result.loss_fn_outputs]
    assert [len(lp) for lp in logprobs] == [len(d.loss_fn_inputs["target_tokens"].data) for d in data]

    saved = training.save_state("final").result()
    assert saved.path == f"tinker://{training.model_id}/weights/final"
    forward = training.forward(data, "cross_entropy").result()
    hf_dirs = list(
        (process.workdir / "gateway" / training.model_id / "checkpoints" / "weights" / "final").glob("*/hf")
    )
    assert len(hf_dirs) == 1
    model = AutoModelForCausalLM.from_pretrained(hf_dirs[0], dtype=torch.float32).eval()
    with torch.no_grad():
        for datum, out in zip(data, forward.loss_fn_outputs, strict=True):
            inputs = torch.tensor([datum.model_input.to_ints()])
            targets = torch.tensor(datum.loss_fn_inputs["target_tokens"].data)
            expected = torch.log_softmax(model(inputs).logits[0].float(), -1).gather(-1, targets[:, None])[
                :, 0
            ]
            np.testing.assert_allclose(out["logprobs"].to_numpy(), expected.numpy(), atol=1e-5)

    checkpoints = (
        tinker.RestClient(base_url=base_url, api_key=TOKEN).list_checkpoints(training.model_id).result()
    )
    assert [c.tinker_path for c in checkpoints.checkpoints] == [saved.path]
