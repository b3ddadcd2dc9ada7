"""The data stage: corpora, sentencepiece tokenizers, cached encoded splits and batching.

Modules (imported explicitly, so that using one does not pull in torch or the others):

- `seq2seq.data.prepare`: the orchestration (`prepare_data`, `prepare_from_config`).
- `seq2seq.data.corpus`: reading and checking parallel text files; `DataError`.
- `seq2seq.data.multi30k`: fetching Multi30k with checksum verification.
- `seq2seq.data.tokenizer`: `SentencePieceTokenizer`, `Tokenizers`.
- `seq2seq.data.dataset`: memory-mapped `TokenArray` and `ParallelDataset`.
- `seq2seq.data.batching`: `TokenBucketSampler`, `Batch`, `collate` (needs torch).
- `seq2seq.data.vocab`: the fixed special ids PAD_ID, UNK_ID, BOS_ID, EOS_ID.
"""
