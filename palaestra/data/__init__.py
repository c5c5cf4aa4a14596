"""Dataset helpers: stratified sampling of a numeric column (curricula of difficulty), and
rollouts as a Hugging Face dataset."""

from palaestra.data.rollouts import messages_from_row, rollouts_to_dataset, rollouts_to_rows, save_dataset
from palaestra.data.sampling import band_edges, stratified_bands, stratified_values, with_stratified_column

__all__ = [
    "band_edges",
    "messages_from_row",
    "rollouts_to_dataset",
    "rollouts_to_rows",
    "save_dataset",
    "stratified_bands",
    "stratified_values",
    "with_stratified_column",
]
