"""The rollway dataloader service. Import nothing here: other services import rollway.dataloader.v1 (protos) only."""
