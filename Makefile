# cagebox build and test entry points. scripts/setup.sh installs what they need.
GO ?= go
BIN := bin

.PHONY: build test test-short bench demo clean

build:
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/cagebox-agent ./cmd/cagebox-agent
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/cagebox ./cmd/cagebox

test: build
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 40m ./...

bench: build
	$(GO) run ./bench $(BENCHFLAGS)

demo: build
	./scripts/demo.sh

clean:
	rm -rf $(BIN)
