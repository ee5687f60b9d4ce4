"""Derived bundles: a bundle's graph remade for a device, written as a new verified bundle.

``edge derive qnn-static`` fixes every dynamic axis per bucket (one static copy of the
graph per bucket, ONNX Runtime's ``make_dynamic_shape_fixed`` functions);
``edge derive qnn-qdq`` also QDQ-quantises each copy (``onnxruntime.quantization``,
uint8 activations and weights, as QNN HTP wants) and records its own numerical bound
against the fp32 reference. Needs ``onnx`` and ``onnxruntime``; edge-core never imports
it (the qnn plugin registers the command through ``edge_register_commands``).
"""
