package route

import "github.com/kvgate/kvgate/api/v1alpha1"

const llama = "meta-llama/Llama-3.1-8B-Instruct"

func schedulerSpec(name, model string, endpoints ...string) v1alpha1.SchedulerSpec {
	return v1alpha1.SchedulerSpec{Name: name, ModelName: model, Endpoints: endpoints}
}
