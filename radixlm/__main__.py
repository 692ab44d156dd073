"""`python -m radixlm ...` is the `radixlm` command."""

from radixlm.cli import main

main()
