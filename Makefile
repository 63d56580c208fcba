# Thin wrappers over dev.py, which needs nothing but Python 3.11+.
.PHONY: demo test bench
demo:
	python3 dev.py demo
test:
	python3 dev.py test
bench:
	python3 dev.py bench
