"""The rollway trainer service. Import nothing here: other services import rollway.trainer.v1 (protos) only."""
