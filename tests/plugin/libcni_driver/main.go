// libcni-driver calls the libcni API the way a container runtime does, for the two
// calls that cnitool cannot make: GC with a list of valid attachments (cnitool
// passes no GC arguments at all) and VERSION of one plugin.
//
//	libcni-driver gc <network> [<containerID>/<ifname> ...]   # none listed: an empty (nil) list
//	libcni-driver version <plugin type>
//
// The environment is cnitool's: NETCONFPATH (conflist dir), CNI_PATH. Errors go to
// stderr as libcni reports them, with exit code 1.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
)

func main() {
	if len(os.Args) < 3 {
		fail(fmt.Errorf("usage: libcni-driver gc <network> [cid/ifname ...] | version <plugin type>"))
	}
	cni := libcni.NewCNIConfig(filepath.SplitList(os.Getenv("CNI_PATH")), nil)
	ctx := context.Background()
	switch os.Args[1] {
	case "gc":
		list, err := libcni.LoadNetworkConf(os.Getenv("NETCONFPATH"), os.Args[2])
		if err != nil {
			fail(err)
		}
		// A nil slice when none are listed: what a runtime with no sandbox left passes.
		var valid []types.GCAttachment
		for _, arg := range os.Args[3:] {
			cid, ifname, ok := strings.Cut(arg, "/")
			if !ok {
				fail(fmt.Errorf("attachment %q is not containerID/ifname", arg))
			}
			valid = append(valid, types.GCAttachment{ContainerID: cid, IfName: ifname})
		}
		fail(cni.GCNetworkList(ctx, list, &libcni.GCArgs{ValidAttachments: valid}))
	case "version":
		info, err := cni.GetVersionInfo(ctx, os.Args[2])
		if err != nil {
			fail(err)
		}
		out, _ := json.Marshal(map[string][]string{"supportedVersions": info.SupportedVersions()})
		fmt.Println(string(out))
	default:
		fail(fmt.Errorf("unknown verb %q", os.Args[1]))
	}
}

func fail(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
