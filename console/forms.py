from django import forms


class DecisionForm(forms.Form):
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("reject", "Reject")])
    comment = forms.CharField(required=False, max_length=2000, widget=forms.Textarea)


class RevokeForm(forms.Form):
    reason = forms.CharField(max_length=2000)
