"""The data stage: corpora, sentencepiece tokenizers, cached encoded splits and batching.

Modules (imported explicitly, so that using one does not pull in torch or the others):

- `seq2seq.data.prepare`: the pipeline and its entry points (`prepare_data`,
  `prepare_from_config`) and their result, `PreparedData`.
- `seq2seq.data.settings`: `TokenizerSettings`, `FilterSettings`, reading plain config dicts.
- `seq2seq.data.sources`: the `data` config node to local files (`corpus_files_from_config`).
- `seq2seq.data.corpora`: `data.train` as one or several weighted, tagged `TrainCorpus`es,
  checked before a run.
- `seq2seq.data.text_files`: reading and checking parallel text files; `DataError`.
- `seq2seq.data.multi30k`: fetching Multi30k with checksum verification.
- `seq2seq.data.hashing`: file SHA-256 sums and line counts, and their memo.
- `seq2seq.data.cache`: the prepared-data cache: key, layout, building it all or nothing.
- `seq2seq.data.tokenizer_training`: training a build's tokenizer(s) on the training corpora.
- `seq2seq.data.encode`: encoding and filtering splits into token files.
- `seq2seq.data.summary`: the printable summary table.
- `seq2seq.data.tokenizer`: `SentencePieceTokenizer`, `SubsetTokenizer`, `Tokenizers`.
- `seq2seq.data.dataset`: memory-mapped `TokenArray` and `ParallelDataset`.
- `seq2seq.data.mixing`: `CorpusMix`, an epoch's pairs drawn from the corpora by weight, and
  `PairsSeen`, each corpus's share of the pairs trained on.
- `seq2seq.data.batching`: `TokenBucketSampler`, `Batch`, `collate` (needs torch).
- `seq2seq.data.vocab`: the fixed special ids PAD_ID, UNK_ID, BOS_ID, EOS_ID.
"""
