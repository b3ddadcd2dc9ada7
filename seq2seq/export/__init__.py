"""Export: a trained model as a folder an inference runtime decodes (ONNX Runtime)."""
