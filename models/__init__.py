"""Models: the zoo, ONNX export and intake, ``OpGraph``, coarsening and partition cutting.

Nothing here imports torch except ``models.zoo`` and ``models.export``.
"""
