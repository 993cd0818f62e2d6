# cagebox build and test entry points. scripts/setup.sh installs what they need.
GO ?= go
BIN := bin

.PHONY: build test test-runtimes test-short bench demo clean

# bin/cagebox is the CLI (-tags lite: no daemon, runtimes or Kubernetes code
# linked, so it starts in milliseconds); bin/cagebox-server is the full build
# of the same command tree, which the CLI execs for `daemon`, `node`,
# `controller` and the other host-side commands (cmd/cagebox/hostcmds.go).
build:
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/cagebox-agent ./cmd/cagebox-agent
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/cagebox-server ./cmd/cagebox
	CGO_ENABLED=0 $(GO) build -trimpath -tags lite -o $(BIN)/cagebox ./cmd/cagebox

test: build
	$(GO) vet ./...
	$(GO) vet -tags lite ./cmd/cagebox
	$(GO) test -count=1 -timeout 40m ./...
	$(MAKE) -s test-runtimes

# The gateway's and ingress's end-to-end tests again on the other runtimes
# setup installs (E2E_RUNTIMES= to skip): egress, credentials, pools, and
# inbound — published ports, webhooks, the Discord relay — and the E2B SDK
# suite (about 9 minutes for both). A runtime that cannot run fails the
# tests.
E2E_RUNTIMES ?= gvisor qemu
test-runtimes: build
	@for rt in $(E2E_RUNTIMES); do \
	  echo "test-runtimes: egress, credential, scrub, path-attack, warm-pool, ingress, webhook, relay and E2B SDK end-to-end tests on $$rt"; \
	  CAGEBOX_E2E_RUNTIME=$$rt $(GO) test -count=1 -timeout 30m -run 'TestEgress$$|TestCredentialSwap$$|TestHMACResign$$|TestResponseScrub$$|TestEgressPathAttacks$$|TestWarmPool$$|TestIngress$$|TestWebhook$$|TestRelayDiscord$$|TestE2BSDK$$' ./test/e2e/ || exit 1; \
	done

bench: build
	$(GO) run ./bench $(BENCHFLAGS)

demo: build
	./scripts/demo.sh

clean:
	rm -rf $(BIN)
