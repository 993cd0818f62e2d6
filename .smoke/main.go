package main

import (
	"fmt"
	"os"
	"os/signal"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

func main() {
	env := &envtest.Environment{BinaryAssetsDirectory: os.Getenv("KUBEBUILDER_ASSETS")}
	cfg, err := env.Start()
	if err != nil {
		panic(err)
	}
	defer env.Stop()
	u, err := env.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, cfg)
	if err != nil {
		panic(err)
	}
	kc, err := u.KubeConfig()
	if err != nil {
		panic(err)
	}
	os.WriteFile(os.Args[1], kc, 0o600)
	fmt.Println("ready", cfg.Host)
	c := make(chan os.Signal, 1)
	signal.Notify(c, os.Interrupt)
	<-c
}
