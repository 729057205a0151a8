package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
)

// captureRecord is one line of the capture file: what one CNI call was handed.
type captureRecord struct {
	Command         string `json:"command"`
	ContainerID     string `json:"containerID"`
	IfName          string `json:"ifname"`
	Network         string `json:"network"`
	PodNamespace    string `json:"podNamespace"`
	PodName         string `json:"podName"`
	DeviceID        string `json:"deviceID"`
	PCIBusID        string `json:"pciBusID"`
	RuntimeDeviceID string `json:"runtimeDeviceID"`
}

type captureConf struct {
	CNIVersion    string `json:"cniVersion"`
	Name          string `json:"name"`
	CaptureFile   string `json:"captureFile"`
	DeviceID      string `json:"deviceID"`
	PCIBusID      string `json:"pciBusID"`
	RuntimeConfig struct {
		DeviceID string `json:"deviceID"`
	} `json:"runtimeConfig"`
	PrevResult json.RawMessage `json:"prevResult"`
}

// capture is the chained CNI plugin mode (see the package comment). It returns the exit code.
func capture() int {
	command := os.Getenv("CNI_COMMAND")
	fail := func(code int, msg string) int {
		out, _ := json.Marshal(map[string]any{"cniVersion": "1.1.0", "code": code, "msg": msg})
		fmt.Println(string(out))
		return 1
	}
	if command == "VERSION" {
		fmt.Println(`{"cniVersion": "1.1.0", "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]}`)
		return 0
	}
	stdin, err := io.ReadAll(os.Stdin)
	if err != nil {
		return fail(5, "read stdin: "+err.Error())
	}
	var conf captureConf
	if err := json.Unmarshal(stdin, &conf); err != nil {
		return fail(6, "decode config: "+err.Error())
	}
	rec := captureRecord{
		Command: command, ContainerID: os.Getenv("CNI_CONTAINERID"), IfName: os.Getenv("CNI_IFNAME"),
		Network: conf.Name, DeviceID: conf.DeviceID, PCIBusID: conf.PCIBusID, RuntimeDeviceID: conf.RuntimeConfig.DeviceID,
	}
	for _, kv := range strings.Split(os.Getenv("CNI_ARGS"), ";") {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "K8S_POD_NAMESPACE":
			rec.PodNamespace = v
		case "K8S_POD_NAME":
			rec.PodName = v
		}
	}
	if conf.CaptureFile != "" && (command == "ADD" || command == "DEL" || command == "CHECK") {
		line, _ := json.Marshal(rec)
		f, err := os.OpenFile(conf.CaptureFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			return fail(5, "open capture file: "+err.Error())
		}
		// One write of a short line with O_APPEND: concurrent calls never interleave.
		_, err = f.Write(append(line, '\n'))
		f.Close()
		if err != nil {
			return fail(5, "write capture file: "+err.Error())
		}
	}
	if command == "ADD" {
		if len(conf.PrevResult) == 0 {
			return fail(7, "vf-capture is a chained plugin: no prevResult")
		}
		os.Stdout.Write(conf.PrevResult)
		fmt.Println()
	}
	return 0
}
