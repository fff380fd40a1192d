"""The read side: answers computed from the state the engine serves, with the core models.

``nominal`` (posteriors recomputed under the current parameters, confusion matrices, worker
quality) and ``predictions`` (the dyadic model's predictions from the rows of the pairs asked
about). The API calls them; they read the store and never write it.
"""
