# Generated from docker/matrix.toml by `python -m harness.ci.matrix bake > docker/docker-bake.hcl`.
# Do not edit: tests/unit/test_matrix.py fails when this file and the matrix disagree.
# Run from the repository root after `pip wheel --no-deps --wheel-dir docker/wheelhouse .`.

variable "OFFLINE" {
  default = "0"
}

# The CPU images' base, but for an entry with a cpu_base of its own (jax011: ubuntu:24.04, for Python 3.12).
variable "CPU_BASE" {
  default = "debian:bookworm-slim"
}

group "default" {
  targets = ["cpu"]
}

group "cpu" {
  targets = ["tf215", "tf216", "tf217", "tf218", "tf219", "tf220", "tf221", "legacy", "jax011"]
}

group "gpu" {
  targets = ["tf215-gpu", "tf216-gpu", "tf217-gpu", "tf218-gpu", "tf219-gpu", "tf220-gpu", "tf221-gpu", "legacy-gpu", "jax011-gpu"]
}

target "_common" {
  context    = "docker"
  dockerfile = "Dockerfile"
}

target "tf215" {
  inherits = ["_common"]
  tags     = ["harness:tf215"]
  args = {
    BASE_IMAGE            = "${CPU_BASE}"
    PYTHON                = "3.11"
    ENTRY                 = "tf215"
    VARIANT               = "cpu"
    KERAS_BACKEND         = "tensorflow"
    TENSORFLOW            = "2.15.1"
    JAX                   = "none"
    KERAS                 = "2"
    FRAMEWORK_REQUIREMENT = "tensorflow-cpu==2.15.1"
    KERAS_REQUIREMENT     = ""
    CUDA                  = "12.2"
    CUDNN                 = "8.9"
    TF_USE_LEGACY_KERAS   = "0"
    OFFLINE               = "${OFFLINE}"
  }
}

target "tf215-gpu" {
  inherits = ["_common"]
  tags     = ["harness:tf215-gpu"]
  args = {
    BASE_IMAGE            = "nvidia/cuda:12.2.2-base-ubuntu22.04"
    PYTHON                = "3.11"
    ENTRY                 = "tf215"
    VARIANT               = "gpu"
    KERAS_BACKEND         = "tensorflow"
    TENSORFLOW            = "2.15.1"
    JAX                   = "none"
    KERAS                 = "2"
    FRAMEWORK_REQUIREMENT = "tensorflow[and-cuda]==2.15.1"
    KERAS_REQUIREMENT     = ""
    CUDA                  = "12.2"
    CUDNN                 = "8.9"
    TF_USE_LEGACY_KERAS   = "0"
    OFFLINE               = "${OFFLINE}"
  }
}

target "tf216" {
  inherits = ["_common"]
  tags     = ["harness:tf216"]
  args = {
    BASE_IMAGE            = "${CPU_BASE}"
    PYTHON                = "3.11"
    ENTRY                 = "tf216"
    VARIANT               = "cpu"
    KERAS_BACKEND         = "tensorflow"
    TENSORFLOW            = "2.16.2"
    JAX                   = "none"
    KERAS                 = "3"
    FRAMEWORK_REQUIREMENT = "tensorflow-cpu==2.16.2"
    KERAS_REQUIREMENT     = ""
    CUDA                  = "12.3"
    CUDNN                 = "8.9"
    TF_USE_LEGACY_KERAS   = "0"
    OFFLINE               = "${OFFLINE}"
  }
}

target "tf216-gpu" {
  inherits = ["_common"]
  tags     = ["harness:tf216-gpu"]
  args = {
    BASE_IMAGE            = "nvidia/cuda:12.3.2-base-ubuntu22.04"
    PYTHON                = "3.11"
    ENTRY                 = "tf216"
    VARIANT               = "gpu"
    KERAS_BACKEND         = "tensorflow"
    TENSORFLOW            = "2.16.2"
    JAX                   = "none"
    KERAS                 = "3"
    FRAMEWORK_REQUIREMENT = "tensorflow[and-cuda]==2.16.2"
    KERAS_REQUIREMENT     = ""
    CUDA                  = "12.3"
    CUDNN                 = "8.9"
    TF_USE_LEGACY_KERAS   = "0"
    OFFLINE               = "${OFFLINE}"
  }
}

target "tf217" {
  inherits = ["_common"]
  tags     = ["harness:tf217"]
  args = {
    BASE_IMAGE            = "${CPU_BASE}"
    PYTHON                = "3.11"
    ENTRY                 = "tf217"
    VARIANT               = "cpu"
    KERAS_BACKEND         = "tensorflow"
    TENSORFLOW            = "2.17.1"
    JAX                   = "none"
    KERAS                 = "3"
    FRAMEWORK_REQUIREMENT = "tensorflow-cpu==2.17.1"
    KERAS_REQUIREMENT     = ""
    CUDA                  = "12.3"
    CUDNN                 = "8.9"
    TF_USE_LEGACY_KERAS   = "0"
    OFFLINE               = "${OFFLINE}"
  }
}

target "tf217-gpu" {
  inherits = ["_common"]
  tags     = ["harness:tf217-gpu"]
  args = {
    BASE_IMAGE            = "nvidia/cuda:12.3.2-base-ubuntu22.04"
    PYTHON                = "3.11"
    ENTRY                 = "tf217"
    VARIANT               = "gpu"
    KERAS_BACKEND         = "tensorflow"
    TENSORFLOW            = "2.17.1"
    JAX                   = "none"
    KERAS                 = "3"
    FRAMEWORK_REQUIREMENT = "tensorflow[and-cuda]==2.17.1"
    KERAS_REQUIREMENT     = ""
    CUDA                  = "12.3"
    CUDNN                 = "8.9"
    TF_USE_LEGACY_KERAS   = "0"
    OFFLINE               = "${OFFLINE}"
  }
}

target "tf218" {
  inherits = ["_common"]
  tags     = ["harness:tf218"]
  args = {
    BASE_IMAGE            = "${CPU_BASE}"
    PYTHON                = "3.11"
    ENTRY                 = "tf218"
    VARIANT               = "cpu"
    KERAS_BACKEND         = "tensorflow"
    TENSORFLOW            = "2.18.1"
    JAX                   = "none"
    KERAS                 = "3"
    FRAMEWORK_REQUIREMENT = "tensorflow-cpu==2.18.1"
    KERAS_REQUIREMENT     = ""
    CUDA                  = "12.5"
    CUDNN                 = "9.3"
    TF_USE_LEGACY_KERAS   = "0"
    OFFLINE               = "${OFFLINE}"
  }
}

target "tf218-gpu" {
  inherits = ["_common"]
  tags     = ["harness:tf218-gpu"]
  args = {
    BASE_IMAGE            = "nvidia/cuda:12.5.1-base-ubuntu22.04"
    PYTHON                = "3.11"
    ENTRY                 = "tf218"
    VARIANT               = "gpu"
    KERAS_BACKEND         = "tensorflow"
    TENSORFLOW            = "2.18.1"
    JAX                   = "none"
    KERAS                 = "3"
    FRAMEWORK_REQUIREMENT = "tensorflow[and-cuda]==2.18.1"
    KERAS_REQUIREMENT     = ""
    CUDA                  = "12.5"
    CUDNN                 = "9.3"
    TF_USE_LEGACY_KERAS   = "0"
    OFFLINE               = "${OFFLINE}"
  }
}

target "tf219" {
  inherits = ["_common"]
  tags     = ["harness:tf219"]
  args = {
    BASE_IMAGE            = "${CPU_BASE}"
    PYTHON                = "3.11"
    ENTRY                 = "tf219"
    VARIANT               = "cpu"
    KERAS_BACKEND         = "tensorflow"
    TENSORFLOW            = "2.19.1"
    JAX                   = "none"
    KERAS                 = "3"
    FRAMEWORK_REQUIREMENT = "tensorflow-cpu==2.19.1"
    KERAS_REQUIREMENT     = ""
    CUDA                  = "12.5"
    CUDNN                 = "9.3"
    TF_USE_LEGACY_KERAS   = "0"
    OFFLINE               = "${OFFLINE}"
  }
}

target "tf219-gpu" {
  inherits = ["_common"]
  tags     = ["harness:tf219-gpu"]
  args = {
    BASE_IMAGE            = "nvidia/cuda:12.5.1-base-ubuntu22.04"
    PYTHON                = "3.11"
    ENTRY                 = "tf219"
    VARIANT               = "gpu"
    KERAS_BACKEND         = "tensorflow"
    TENSORFLOW            = "2.19.1"
    JAX                   = "none"
    KERAS                 = "3"
    FRAMEWORK_REQUIREMENT = "tensorflow[and-cuda]==2.19.1"
    KERAS_REQUIREMENT     = ""
    CUDA                  = "12.5"
    CUDNN                 = "9.3"
    TF_USE_LEGACY_KERAS   = "0"
    OFFLINE               = "${OFFLINE}"
  }
}

target "tf220" {
  inherits = ["_common"]
  tags     = ["harness:tf220"]
  args = {
    BASE_IMAGE            = "${CPU_BASE}"
    PYTHON                = "3.11"
    ENTRY                 = "tf220"
    VARIANT               = "cpu"
    KERAS_BACKEND         = "tensorflow"
    TENSORFLOW            = "2.20.0"
    JAX                   = "none"
    KERAS                 = "3"
    FRAMEWORK_REQUIREMENT = "tensorflow-cpu==2.20.0"
    KERAS_REQUIREMENT     = ""
    CUDA                  = "12.5"
    CUDNN                 = "9.3"
    TF_USE_LEGACY_KERAS   = "0"
    OFFLINE               = "${OFFLINE}"
  }
}

target "tf220-gpu" {
  inherits = ["_common"]
  tags     = ["harness:tf220-gpu"]
  args = {
    BASE_IMAGE            = "nvidia/cuda:12.5.1-base-ubuntu22.04"
    PYTHON                = "3.11"
    ENTRY                 = "tf220"
    VARIANT               = "gpu"
    KERAS_BACKEND         = "tensorflow"
    TENSORFLOW            = "2.20.0"
    JAX                   = "none"
    KERAS                 = "3"
    FRAMEWORK_REQUIREMENT = "tensorflow[and-cuda]==2.20.0"
    KERAS_REQUIREMENT     = ""
    CUDA                  = "12.5"
    CUDNN                 = "9.3"
    TF_USE_LEGACY_KERAS   = "0"
    OFFLINE               = "${OFFLINE}"
  }
}

target "tf221" {
  inherits = ["_common"]
  tags     = ["harness:tf221"]
  args = {
    BASE_IMAGE            = "${CPU_BASE}"
    PYTHON                = "3.11"
    ENTRY                 = "tf221"
    VARIANT               = "cpu"
    KERAS_BACKEND         = "tensorflow"
    TENSORFLOW            = "2.21.0"
    JAX                   = "none"
    KERAS                 = "3.15.1"
    FRAMEWORK_REQUIREMENT = "tensorflow-cpu==2.21.0"
    KERAS_REQUIREMENT     = "keras==3.15.1"
    CUDA                  = "12.5"
    CUDNN                 = "9.3"
    TF_USE_LEGACY_KERAS   = "0"
    OFFLINE               = "${OFFLINE}"
  }
}

target "tf221-gpu" {
  inherits = ["_common"]
  tags     = ["harness:tf221-gpu"]
  args = {
    BASE_IMAGE            = "nvidia/cuda:12.5.1-base-ubuntu22.04"
    PYTHON                = "3.11"
    ENTRY                 = "tf221"
    VARIANT               = "gpu"
    KERAS_BACKEND         = "tensorflow"
    TENSORFLOW            = "2.21.0"
    JAX                   = "none"
    KERAS                 = "3.15.1"
    FRAMEWORK_REQUIREMENT = "tensorflow[and-cuda]==2.21.0"
    KERAS_REQUIREMENT     = "keras==3.15.1"
    CUDA                  = "12.5"
    CUDNN                 = "9.3"
    TF_USE_LEGACY_KERAS   = "0"
    OFFLINE               = "${OFFLINE}"
  }
}

target "legacy" {
  inherits = ["_common"]
  tags     = ["harness:legacy"]
  args = {
    BASE_IMAGE            = "${CPU_BASE}"
    PYTHON                = "3.11"
    ENTRY                 = "legacy"
    VARIANT               = "cpu"
    KERAS_BACKEND         = "tensorflow"
    TENSORFLOW            = "2.21.0"
    JAX                   = "none"
    KERAS                 = "2.21.0"
    FRAMEWORK_REQUIREMENT = "tensorflow-cpu==2.21.0"
    KERAS_REQUIREMENT     = "tf-keras==2.21.0"
    CUDA                  = "12.5"
    CUDNN                 = "9.3"
    TF_USE_LEGACY_KERAS   = "1"
    OFFLINE               = "${OFFLINE}"
  }
}

target "legacy-gpu" {
  inherits = ["_common"]
  tags     = ["harness:legacy-gpu"]
  args = {
    BASE_IMAGE            = "nvidia/cuda:12.5.1-base-ubuntu22.04"
    PYTHON                = "3.11"
    ENTRY                 = "legacy"
    VARIANT               = "gpu"
    KERAS_BACKEND         = "tensorflow"
    TENSORFLOW            = "2.21.0"
    JAX                   = "none"
    KERAS                 = "2.21.0"
    FRAMEWORK_REQUIREMENT = "tensorflow[and-cuda]==2.21.0"
    KERAS_REQUIREMENT     = "tf-keras==2.21.0"
    CUDA                  = "12.5"
    CUDNN                 = "9.3"
    TF_USE_LEGACY_KERAS   = "1"
    OFFLINE               = "${OFFLINE}"
  }
}

target "jax011" {
  inherits = ["_common"]
  tags     = ["harness:jax011"]
  args = {
    BASE_IMAGE            = "ubuntu:24.04"
    PYTHON                = "3.12"
    ENTRY                 = "jax011"
    VARIANT               = "cpu"
    KERAS_BACKEND         = "jax"
    TENSORFLOW            = "none"
    JAX                   = "0.11.2"
    KERAS                 = "3.15.1"
    FRAMEWORK_REQUIREMENT = "jax==0.11.2 jaxlib==0.11.2"
    KERAS_REQUIREMENT     = "keras==3.15.1"
    CUDA                  = "12.6"
    CUDNN                 = "9.10"
    TF_USE_LEGACY_KERAS   = "0"
    OFFLINE               = "${OFFLINE}"
  }
}

target "jax011-gpu" {
  inherits = ["_common"]
  tags     = ["harness:jax011-gpu"]
  args = {
    BASE_IMAGE            = "nvidia/cuda:12.6.3-base-ubuntu24.04"
    PYTHON                = "3.12"
    ENTRY                 = "jax011"
    VARIANT               = "gpu"
    KERAS_BACKEND         = "jax"
    TENSORFLOW            = "none"
    JAX                   = "0.11.2"
    KERAS                 = "3.15.1"
    FRAMEWORK_REQUIREMENT = "jax[cuda12]==0.11.2 jaxlib==0.11.2"
    KERAS_REQUIREMENT     = "keras==3.15.1"
    CUDA                  = "12.6"
    CUDNN                 = "9.10"
    TF_USE_LEGACY_KERAS   = "0"
    OFFLINE               = "${OFFLINE}"
  }
}
