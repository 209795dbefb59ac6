"""The bench layer: measuring, tuning and checking harness' core on workloads and public models.

Above the core library (``harness.split``, ``devices``, ``emulate``, ``compat``,
``parallel``, ``equivalence``, ``watchdog``) and below the CLI; it never imports
``harness.ci``. Its optional dependencies (matplotlib, nvidia-ml-py, asv) are the
``[bench]`` extra.
"""
