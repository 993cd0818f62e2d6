//go:build !lite

package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/cagebox/cagebox/internal/image"
	"github.com/cagebox/cagebox/internal/sandbox"
	"github.com/cagebox/cagebox/internal/vmimage"
	"github.com/cagebox/cagebox/isolation/qemu"
)

// imageHostCmds are `image build`, `image ls` and `image rm`: they work on
// this host's image cache directly (debootstrap, the qemu templates, the
// references of live sandboxes), so they run in the full binary.
func imageHostCmds(g *globals) []*cobra.Command {
	var force bool
	var pkgs []string
	var vm string
	build := &cobra.Command{
		Use:   docImageBuild.use,
		Short: docImageBuild.short,
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := "default"
			if len(args) == 1 {
				name = args[0]
			}
			cache := &image.Cache{Dir: filepath.Join(g.home, "images")}
			start := time.Now()
			var img *image.Image
			var err error
			if name == "busybox" {
				img, err = cache.BuildBusybox(cmd.Context(), name)
			} else {
				img, err = cache.Build(cmd.Context(), image.BuildOptions{Name: name, Packages: pkgs, Progress: os.Stderr, Force: force})
			}
			if err != nil {
				return err
			}
			if name == "busybox" { // debootstrap builds report their own progress and result
				fmt.Fprintf(os.Stderr, "image %s ready in %s (%d KiB, %s)\n", img.Name, time.Since(start).Round(time.Millisecond), img.SizeBytes>>10, img.Digest)
			}
			return prepareVM(cmd.Context(), g, img, vm)
		},
	}
	build.Flags().BoolVar(&force, "force", false, "rebuild even if the image exists")
	build.Flags().StringVar(&vm, "vm", "auto", "also make the image's microVM artifacts (guest kernel, initramfs, ext4 disk): yes, no, or auto (when qemu-system-x86_64 is installed)")
	build.Flags().StringSliceVar(&pkgs, "packages", nil, "Debian packages to install (default: sh, coreutils, curl, python3, ca-certificates, procps)")
	var lsJSON bool
	ls := &cobra.Command{
		Use:   docImageLs.use,
		Short: docImageLs.short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cache := &image.Cache{Dir: filepath.Join(g.home, "images")}
			// IN USE counts live sandboxes only: references of homes or
			// sandboxes that are gone are dropped first.
			if _, err := cache.PruneOrphans(sandbox.ImageRefAlive); err != nil {
				fmt.Fprintf(os.Stderr, "warning: pruning image references: %v\n", err)
			}
			l, err := cache.List()
			if err != nil {
				return err
			}
			// Templates: booted, saved microVMs that qemu sandboxes are
			// restored from (isolation/qemu, template.go).
			tpls, err := qemu.New(qemu.Options{Dir: filepath.Join(g.home, "vm")}).Templates()
			if err != nil {
				return err
			}
			if lsJSON {
				if l == nil {
					l = []*image.Image{}
				}
				if tpls == nil {
					tpls = []qemu.Template{}
				}
				return printJSON(struct {
					Images    []*image.Image  `json:"images"`
					Templates []qemu.Template `json:"templates"`
				}{l, tpls})
			}
			if err := printList(false, l, []string{"NAME", "SIZE", "CREATED", "DIGEST", "IN USE"}, func(i *image.Image) []string {
				d := i.Digest
				if len(d) > 19 {
					d = d[:19]
				}
				h, _ := cache.Holders(i.Name)
				return []string{i.Name, fmt.Sprintf("%dMiB", i.SizeBytes>>20), i.CreatedAt.Local().Format(time.DateTime), d, fmt.Sprint(len(h))}
			}); err != nil || len(tpls) == 0 {
				return err
			}
			fmt.Println("\nmicroVM templates (qemu sandboxes restore from them; rebuilt when an input changes):")
			return printList(false, tpls, []string{"TEMPLATE", "IMAGE", "MEMORY", "CPUS", "NET", "DISK", "BUILT IN", "CREATED", "STATE"}, func(t qemu.Template) []string {
				state := "ready"
				if t.Stale {
					state = "stale (removed at the next daemon start)"
				}
				return []string{t.Digest[:min(12, len(t.Digest))], t.Image, fmt.Sprintf("%dMiB", t.MemoryBytes>>20), fmt.Sprint(t.CPUs), fmt.Sprint(t.NIC),
					fmt.Sprintf("%dMiB", t.SizeBytes>>20), t.BuildTime.Round(100 * time.Millisecond).String(), t.Created.Local().Format(time.DateTime), state}
			})
		},
	}
	ls.Flags().BoolVar(&lsJSON, "json", false, "print JSON: images and templates")
	rm := &cobra.Command{
		Use:   docImageRm.use,
		Short: docImageRm.short,
		Long: `Remove a cached image. An image that is the root filesystem of sandboxes
that still exist (running, paused, stopped or pooled) is not removed: the error
names them. Rebuilding an image with --force while sandboxes use it keeps their
tree until the last of them is removed; new sandboxes get the new one.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cache := &image.Cache{Dir: filepath.Join(g.home, "images")}
			// Only sandboxes that exist hold an image: references of
			// removed homes or of sandboxes a killed daemon never released
			// are dropped first.
			if _, err := cache.PruneOrphans(sandbox.ImageRefAlive); err != nil {
				fmt.Fprintf(os.Stderr, "warning: pruning image references: %v\n", err)
			}
			if err := cache.Remove(args[0]); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "removed image %s\n", args[0])
			return nil
		},
	}
	return []*cobra.Command{build, ls, rm}
}

// prepareVM makes the microVM artifacts of img (see package vmimage):
// fetches the pinned guest kernel if needed, builds the initramfs around the
// agent and packs the image as ext4, so that the first VM sandbox of the
// image starts without that work.
func prepareVM(ctx context.Context, g *globals, img *image.Image, mode string) error {
	switch mode {
	case "no", "false":
		return nil
	case "auto":
		if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
			return nil
		}
	case "yes", "true":
	default:
		return fmt.Errorf("--vm %q: use yes, no or auto", mode)
	}
	agent := os.Getenv("CAGEBOX_AGENT")
	if agent == "" {
		agent = defaultAgentPath()
	}
	start := time.Now()
	vc := &vmimage.Cache{Dir: filepath.Join(g.home, "vm"), Progress: os.Stderr}
	a, err := vc.Prepare(ctx, img, agent)
	if err != nil {
		return fmt.Errorf("vm artifacts of image %s: %w", img.Name, err)
	}
	fmt.Fprintf(os.Stderr, "vm artifacts of %s ready in %s (kernel %s, disk %s)\n", img.Name, time.Since(start).Round(time.Millisecond), vmimage.KernelRelease, filepath.Base(a.RootDisk))
	return nil
}
