"""The rollway coordinator service. Import nothing here: other services import rollway.coordinator.v1 (protos) only."""
