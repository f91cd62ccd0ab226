// Command kube is a multi-call binary holding kube-apiserver, kube-controller-manager and
// kube-scheduler from k8s.io/kubernetes. The component is chosen by the name it is invoked as
// (symlinks made by hack/build.sh) or by the first argument: `kube apiserver --help`.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	_ "time/tzdata" // CronJob time zones

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

var commands = map[string]func() *cobra.Command{
	"kube-apiserver":          func() *cobra.Command { return apiserver.NewAPIServerCommand() },
	"kube-controller-manager": func() *cobra.Command { return controllermanager.NewControllerManagerCommand() },
	"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
}

func main() {
	name := filepath.Base(os.Args[0])
	if _, ok := commands[name]; !ok && len(os.Args) > 1 {
		name = "kube-" + strings.TrimPrefix(os.Args[1], "kube-")
		os.Args = append([]string{name}, os.Args[2:]...)
	}
	newCmd, ok := commands[name]
	if !ok {
		fmt.Fprintln(os.Stderr, "usage: kube apiserver|controller-manager|scheduler [flags] (or call via a kube-<component> symlink)")
		os.Exit(2)
	}
	os.Exit(cli.Run(newCmd()))
}
