"""The CI layer: the TF x Keras x CUDA matrix, its Docker images, the compatibility report and the bench gate.

Above the core library and the bench layer, below the CLI. Nothing in the core or the
bench layer imports it.
"""
