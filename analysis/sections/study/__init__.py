"""The study's own report sections: what only the fusion study's runs carry (per-document
lengths, train-short-test-long evaluation lengths, the gated operators' gate by position, the
embedding-scale axis, the bag-of-words reference, the published numbers). Each shows nothing
when its metrics or artifacts are absent."""
