"""What the trainer minimises: the losses by `--loss-type` (losses.py: registry and reduction),
the PPO clipped objective (policy_loss.py), the Tinker API's per-datum losses (datum_losses.py),
and their parts: KL estimators (kl.py), rollout corrections (rollout_correction.py), the token
part of the advantage estimators (returns.py), non-finite inputs (non_finite.py), per-source
loss metrics (per_source.py) and what a loss gets (loss_inputs.py)."""
