"""The model: the acoustic encoder (conv front end and Transformer), its MLM objective and the CQT target."""
