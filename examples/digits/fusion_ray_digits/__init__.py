"""fusion-ray's example trainable outside its own study: a small MLP on scikit-learn's digits."""
