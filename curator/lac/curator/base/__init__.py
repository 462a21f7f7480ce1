"""What every other wing of the curator stands on: n-gram items and vocabularies (``ngrams``), the public
prior that fixes the release vocabulary (``prior``), and worker processes that end with the curator
(``lifeline``). Imports no other wing."""
