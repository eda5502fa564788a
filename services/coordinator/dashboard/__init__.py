"""The live web dashboard of runs: metrics, rollouts token by token, services, step timeline."""
