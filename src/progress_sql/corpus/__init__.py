"""A corpus as the rest of the pipeline reads it: the example records, the on-disk layout
(``records``) and the schemas of its SQLite databases (``schema``). Pure Python; the data
package builds and imports corpora in this layout."""
