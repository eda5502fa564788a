"""What a run will take, known before it starts, with no torch (so `rollway plan` and `rollway run`'s
check stay instant): its steps and data (steps.py), its micro-batches (batch.py), the model's shape
(shape.py), the memory each service will need (memory.py, from coefficients.py), what this machine
has (host.py), and the words that say it all (text.py)."""
