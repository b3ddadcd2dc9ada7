"""The data stage: corpora, sentencepiece tokenizers, cached encoded splits and batching.

The modules are imported explicitly, so that using one does not pull in torch (only
`seq2seq.data.batching` needs it) or the others. The pipeline's entry points are
`seq2seq.data.prepare`'s `prepare_data` and `prepare_from_config`.
"""
